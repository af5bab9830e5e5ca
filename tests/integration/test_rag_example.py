"""The RAG example: an OpenAI Agents SDK agent searching through an MCP server (stdio), run by fulgor
unchanged: every call recorded with the engine's ids and the SDK agent's name, the MCP search
answering from the real index, the warm start rendering exactly what rollouts see, and a crashing
tool server failing its rollout with a clear error and leaving no process behind."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("agents")

from tests.engine_support import assert_logprobs_of
from tests.integration.trainer_support import scripted_trainer
from tests.process_support import left_behind

from examples.rag.agent import AGENT_NAME, ROOT, rag_agent
from examples.rag.corpus import Task, make_splits, make_world
from examples.rag.index import SearchIndex, build_index, format_results
from examples.rag.warm_start import CHAT_TOOL, solution
from fulgor import GRPO, RolloutConfig, Trainer
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from fulgor.types import ModelCall

CRASHING_SERVER = "tests.integration.crashing_search_server"


@pytest.fixture(scope="module")
def world_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Task], str]:
    world = make_world(0, people=200, companies=30, cities=40, countries=8)
    index = build_index(tmp_path_factory.mktemp("rag") / "index.sqlite", world.passages)
    tasks = make_splits(world, 0, (60, 8, 8))["train"]
    return [Task(**task, index=str(index)) for task in tasks], str(index)  # type: ignore[typeddict-unknown-key]


async def recorded(run_dir: Path) -> list[tuple[str, list[ModelCall], str | None, dict[str, Any]]]:
    """Each rollout's status, model calls, latest attempt's error and reward values, oldest first."""
    store = SqliteStore(run_dir / "store.sqlite")
    try:
        found = []
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id, name="fulgor.model_call")
            calls = [ModelCall.model_validate(s.attributes["fulgor.model_call"]) for s in spans]
            rewards = await store.query_spans(rollout.rollout_id, name="fulgor.reward")
            values = rewards[-1].attributes.get("fulgor.reward.values", {}) if rewards else {}
            attempts = await store.list_attempts(rollout.rollout_id)
            found.append((rollout.status, calls, attempts[-1].error, values))
        return found
    finally:
        await store.close()


def search_servers() -> list[str]:
    """Processes this test started still running (runners, their search servers), and search
    servers that outlived their runner."""
    return left_behind("examples.rag.search_server", CRASHING_SERVER)


def gold_replies(task: Task) -> list[ScriptedReply]:
    """A simulated model that searches each hop of ``task``'s solution, then answers."""
    calls = [
        ScriptedReply(text="", tool_calls=(ScriptedToolCall("search", {"query": hop["query"]}),))
        for hop in task["hops"]
    ]
    return [*calls, ScriptedReply(text=f"Answer: {task['answer']}")]


def test_the_agent_runs_on_the_local_engine_with_its_calls_named_and_recorded(
    tmp_path: Path, world_index: tuple[list[Task], str]
) -> None:
    tasks, _ = world_index
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    trainer = Trainer(
        algorithm=GRPO(max_tokens=16),
        engine=EngineConfig(model=model, device="cpu"),
        run_dir=tmp_path / "run",
        n_runners=1,
        progress=False,
    )
    report = trainer.dev(rag_agent, tasks[:4])
    assert [r.status for r in report.rollouts] == ["succeeded"] * 4
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights, tokenizer = AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model)
    for status, calls, _, values in asyncio.run(recorded(tmp_path / "run")):
        assert status == "succeeded"
        assert calls
        assert set(values) == {"reward", "f1", "format"}  # 0.1 x format + 0.9 x F1, with its terms
        for call in calls:
            assert_logprobs_of(weights, call)  # exactly the ids the engine sampled, with its logprobs
            assert call.request["messages"][1]["content"] in tokenizer.decode(call.prompt_token_ids)
            assert call.agent_name == AGENT_NAME  # named by fulgor from the SDK's own agent span
            assert call.request["tools"] == [CHAT_TOOL]  # the MCP server's tool, as the warm start renders it
    assert not search_servers()


def test_the_mcp_search_answers_and_the_warm_start_renders_what_rollouts_see(
    tmp_path: Path, world_index: tuple[list[Task], str]
) -> None:
    tasks, index_path = world_index
    task = next(task for task in tasks if len(task["hops"]) == 3)
    with ScriptedOpenAIServer() as upstream:  # a simulated model on loopback: three searches, an answer
        upstream.script(*gold_replies(task))
        report = scripted_trainer(upstream, tmp_path / "run").dev(rag_agent, [task])
    assert [(r.status, r.reward) for r in report.rollouts] == [("succeeded", 1.0)]
    [(_, calls, _, values)] = asyncio.run(recorded(tmp_path / "run"))
    assert values == {"reward": 1.0, "f1": 1.0, "format": 1.0}
    assert len(calls) == 4
    index = SearchIndex(index_path)
    last = calls[-1].request["messages"]
    tool_results = [message["content"] for message in last if message["role"] == "tool"]
    assert tool_results == [format_results(index.search(hop["query"])) for hop in task["hops"]]
    # The warm start's conversation is the one the gateway built, but for the engine's call ids.
    expected = solution(task, index)[:-1]
    ids = [call["id"] for message in last for call in message.get("tool_calls", [])]
    for number, call_id in enumerate(ids):
        expected_call = expected[2 + 2 * number]
        expected_call["tool_calls"][0]["id"] = call_id
        expected[3 + 2 * number]["tool_call_id"] = call_id
    assert last == expected
    assert calls[-1].request["tools"] == [CHAT_TOOL]


def test_a_crashing_search_server_fails_its_rollout_clearly_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world_index: tuple[list[Task], str]
) -> None:
    monkeypatch.setenv("RAG_MCP_SERVER", CRASHING_SERVER)
    tasks, _ = world_index
    with ScriptedOpenAIServer() as upstream:
        upstream.script(*gold_replies(tasks[0])[:1] * 2)
        trainer = scripted_trainer(
            upstream,
            tmp_path / "run",
            rollout_config=RolloutConfig(timeout_seconds=120, max_attempts=2, retry_on=("failed",)),
        )
        report = trainer.dev(rag_agent, [tasks[0]])
    assert [r.status for r in report.rollouts] == ["failed"]
    [(status, _, error, _)] = asyncio.run(recorded(tmp_path / "run"))
    assert status == "failed"
    assert error is not None
    assert "the search MCP server stopped" in error
    assert (tmp_path / "run" / "logs" / "runners.log").read_text().count(
        "search server crashed"
    ) == 2  # retried once
    assert not search_servers()


def test_fulgor_train_dev_runs_it_from_the_command_line(
    tmp_path: Path, world_index: tuple[list[Task], str]
) -> None:
    tasks, _ = world_index
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks[:2]))
    result = subprocess.run(
        [sys.executable, "-m", "fulgor.cli.main", "train",
         "--agent", "examples.rag.agent:rag_agent", "--dev",
         "--train", str(tmp_path / "tasks.jsonl"), "--model", str(model), "--device", "cpu",
         "--run-dir", str(tmp_path / "run"), "--n-runners", "1", "--max-tokens", "16"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 rollouts, 2 succeeded" in result.stdout
    found = asyncio.run(recorded(tmp_path / "run"))
    assert all(calls and {call.agent_name for call in calls} == {AGENT_NAME} for _, calls, _, _ in found)
    assert not search_servers()
