"""The calc example: dataset splits, the strict reward, and the agent's tool loop over real HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from examples.calc.agent import calc_agent, calculate
from examples.calc.dataset import make_splits
from examples.calc.reward import parse_answer, reward
from fulgor import LLM, RolloutRequest, semconv
from fulgor.runner import Runner, RunnerConfig
from fulgor.store import MemoryStore
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall


def test_splits_are_deterministic_and_disjoint() -> None:
    splits = make_splits(seed=3)
    assert [len(splits[name]) for name in ("train", "val", "test")] == [512, 64, 128]
    assert make_splits(seed=3) == splits
    keys = {name: {_problem(t) for t in tasks} for name, tasks in splits.items()}
    assert sum(len(k) for k in keys.values()) == 512 + 64 + 128  # no problem twice, even within a split
    assert not keys["train"] & keys["val"]
    assert not keys["train"] & keys["test"]
    assert not keys["val"] & keys["test"]
    for task in splits["train"]:
        assert str(task["a"]) in task["question"]
        expected = {"*": task["a"] * task["b"], "+": task["a"] + task["b"], "-": task["a"] - task["b"]}[
            task["op"]
        ]
        assert task["answer"] == expected


def _problem(task: dict[str, Any]) -> tuple[int, int, str]:
    """A task's problem: 12*34 and 34*12 are one (so are 12+34 and 34+12), 34-12 and 12-34 are not."""
    a, b, op = task["a"], task["b"], task["op"]
    return (min(a, b), max(a, b), op) if op in "*+" else (a, b, op)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1776", 1776),
        ("Answer: 1776.", 1776),
        ("  -5 ", -5),
        ("1776 or 1777", None),
        ("It is 1776", None),
        ("", None),
    ],
)
def test_answers_are_parsed_strictly(text: str, expected: int | None) -> None:
    assert parse_answer(text) == expected


def test_a_message_that_merely_contains_the_number_earns_nothing() -> None:
    assert reward("1776", 1776) == 1.0
    assert reward("37*48 = 1776", 1776) == 0.0
    assert reward(None, 1776) == 0.0


def test_calculator_is_safe() -> None:
    assert calculate("37 * 48") == "1776"
    assert calculate("-(3 - 10) / 2") == "3.5"
    assert calculate("1/0").startswith("error")
    assert calculate("open('x')").startswith("error")


async def run_agent(
    replies: list[ScriptedReply], question: str, answer: int
) -> tuple[float, list[dict[str, Any]]]:
    async with ScriptedOpenAIServer(replies) as server:
        store = MemoryStore()
        await store.put_resources({"llm": LLM(endpoint=server.url, model="scripted-model")})
        [created] = await store.enqueue([RolloutRequest(input={"question": question, "answer": answer})])
        runner = Runner(calc_agent, store, config=RunnerConfig(claim_wait_seconds=0.2))
        task = asyncio.create_task(runner.run())
        [done] = await store.wait([created.rollout_id], timeout_seconds=30)
        runner.stop()
        await task
        assert done.status == "succeeded"
        [span] = await store.query_spans(created.rollout_id, name=semconv.SPAN_REWARD)
        await store.close()
        return span.attributes[semconv.ATTR_REWARD_VALUE], server.requests


async def test_agent_calls_the_calculator_then_answers() -> None:
    replies = [
        ScriptedReply(text="", tool_calls=(ScriptedToolCall("calculator", {"expression": "37*48"}),)),
        ScriptedReply(text="1776"),
    ]
    value, requests = await run_agent(replies, "What is 37 times 48?", 1776)
    assert value == 1.0
    assert len(requests) == 2
    assert requests[0]["tools"][0]["function"]["name"] == "calculator"
    tool_message = requests[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"] == "1776"


async def test_agent_that_guesses_wrong_gets_zero() -> None:
    value, requests = await run_agent([ScriptedReply(text="1700")], "What is 37 times 48?", 1776)
    assert value == 0.0
    assert len(requests) == 1


def test_the_demo_trains_in_the_steps_it_documents() -> None:
    from examples.calc.train import demo_grpo
    from examples.calc.warm_start import WarmStartConfig

    grpo = demo_grpo()
    # Steps of 64 rollouts (8 problems x 8), at most 150, stopping once 285 s are used; validation
    # every 10 steps.
    assert (grpo.batch_tasks, grpo.group_size, grpo.max_steps, grpo.max_seconds) == (8, 8, 150, 285.0)
    assert grpo.val_every == 10
    # The warm start: 1,000 steps where every solution calls the calculator, then 150 with a quarter.
    warm = WarmStartConfig()
    assert (warm.tool_steps, warm.steps - warm.tool_steps, warm.tool_fraction) == (1000, 150, 0.25)


def test_a_tool_using_conversation_takes_about_130_tokens_with_the_demos_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from examples.calc.agent import CALCULATOR_TOOL
    from examples.calc.warm_start import corpus, solution
    from fulgor.engine.models import init_model

    splits = make_splits()
    base = init_model(tmp_path / "base", "tiny", seed=0, corpus=corpus(splits["train"]))
    tokenizer = AutoTokenizer.from_pretrained(base)
    lengths = []
    for task in splits["test"][:32]:
        text = tokenizer.apply_chat_template(solution(task, True), tools=[CALCULATOR_TOOL], tokenize=False)
        lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    assert 115 <= sorted(lengths)[len(lengths) // 2] <= 145
