"""SFT through the Trainer, both ways, and the Trainer on an upstream it does not own.

Rejection sampling runs the tiny model's own rollouts and fine-tunes on exactly the tokens the engine
sampled in those the rule keeps. Distillation records a teacher through the gateway first: the
teacher is a simulation of a hosted API (``ScriptedOpenAIServer``, real OpenAI protocol over real
HTTP, answering the calc agent with a calculator call and then the answer, without token ids), and
the student, a tiny model built here with fulgor's chat template, learns its transcripts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("openai")

import torch
from safetensors.torch import load_file
from sample_agents.chat_agent import graded_call

from examples.calc.agent import calc_agent
from examples.calc.dataset import make_splits
from examples.calc.warm_start import corpus
from fulgor import GRPO, SFT, Trainer, semconv
from fulgor.algorithms.sft.distill import teacher_data
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError
from fulgor.gateway import Upstream
from fulgor.store import SqliteStore
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from fulgor.types import ModelCall
from fulgor.weights.lora import LoraConfig
from fulgor.weights.policy import load_policy

TASKS = [
    {"prompt": "Say a word.", "letter": "e"},
    {"prompt": "Name a colour.", "letter": "a"},
]
CALC = make_splits(0, (8, 4, 4))


def engine(model_dir: Path) -> EngineConfig:
    return EngineConfig(model=model_dir, device="cpu", max_model_len=512, seed=0)


def run(algorithm: Any, run_dir: Path, **target: Any) -> Trainer:
    return Trainer(
        algorithm=algorithm, run_dir=run_dir, n_runners=1, max_concurrency=1, torch_threads=1,
        progress=False, **target,
    )  # fmt: skip


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(
        tmp_path_factory.mktemp("sft") / "student", "tiny", seed=0, corpus=corpus(CALC["train"])
    )


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ScriptedOpenAIServer]:
    """A teacher run: the calc agent on 4 tasks through the gateway to a simulated hosted API that
    wants a key and returns no token ids; each answer takes a calculator call, then the result."""
    replies = []
    for task in CALC["train"][:4]:
        expression = f"{task['a']}{task['op']}{task['b']}"
        replies += [
            ScriptedReply(text="", tool_calls=(ScriptedToolCall("calculator", {"expression": expression}),)),
            ScriptedReply(text=f"Answer: {task['answer']}"),
        ]
    run_dir = tmp_path_factory.mktemp("sft") / "teacher"
    with ScriptedOpenAIServer(replies, supports_token_ids=False, model="teacher-large") as server:
        upstream = Upstream(server.url, api_key="sk-simulated", request_token_ids=False)
        report = run(GRPO(max_tokens=64), run_dir, upstream=upstream).dev(calc_agent, CALC["train"][:4])
    assert [r.status for r in report.rollouts] == ["succeeded"] * 4
    assert [r.reward for r in report.rollouts] == [1.0] * 4
    return run_dir, server


def _model_calls(run_dir: Path) -> list[ModelCall]:
    async def read() -> list[ModelCall]:
        store = SqliteStore(run_dir / "store.sqlite")
        try:
            calls = []
            for rollout in await store.query_rollouts():
                for span in await store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL):
                    calls.append(ModelCall.model_validate(span.attributes[semconv.ATTR_MODEL_CALL]))
            return calls
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_run_on_an_upstream_records_its_calls_and_sends_only_its_key(
    teacher_run: tuple[Path, ScriptedOpenAIServer],
) -> None:
    run_dir, server = teacher_run
    calls = _model_calls(run_dir)
    assert len(calls) == 8  # a tool call and an answer per task
    assert {call.response["model"] for call in calls} == {"teacher-large"}  # found at GET /models
    assert all(call.token_ids_missing for call in calls)  # a hosted API: no ids, none asked for
    assert not any("return_token_ids" in body for body in server.requests)
    keys = {headers.get("authorization") for headers in server.request_headers if headers}
    assert keys == {"Bearer sk-simulated"}  # never the run's operator key or an agent's credential
    assert not (run_dir / "checkpoints").exists()


def test_a_weight_changing_algorithm_on_an_upstream_is_refused_before_anything_starts(tmp_path: Path) -> None:
    for algorithm in (GRPO(), SFT(top_k=1)):
        trainer = run(algorithm, tmp_path / "run", upstream="http://127.0.0.1:9/v1")
        with pytest.raises(ConfigError, match=r"changes the model's weights.*Trainer\(engine=EngineConfig"):
            trainer.fit(calc_agent, CALC["train"])
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="either engine=EngineConfig"):
        Trainer(algorithm=GRPO(), upstream="http://127.0.0.1:9/v1", engine=EngineConfig(model=tmp_path))


def test_distillation_learns_the_teachers_turns_rendered_with_the_students_template(
    tmp_path: Path, student: Path, teacher_run: tuple[Path, ScriptedOpenAIServer]
) -> None:
    teacher_dir, _ = teacher_run
    run_dir = tmp_path / "student"
    sft = SFT(from_run=teacher_dir, batch_size=4, max_steps=2, val_before_training=False, max_tokens=48)
    history = run(sft, run_dir, engine=engine(student)).fit(calc_agent, CALC["train"], CALC["val"][:2])

    assert [line["step"] for line in history] == [1, 2]
    for line in history:
        assert line["rollouts"] == 0  # distilling runs no rollouts of its own
        assert (line["rows_tokenised"], line["transcripts"], line["transcripts_not_used"]) == (4.0, 4.0, 0.0)
        assert line["trained_tokens"] > 0
        assert isinstance(line["loss"], float)
    assert history[1]["loss"] < history[0]["loss"]
    assert "val_accuracy" in history[1]
    base = load_file(str(student / "model.safetensors"))
    trained = load_file(str(run_dir / "checkpoints" / "step-2" / "model.safetensors"))
    assert any(not torch.equal(base[name], trained[name]) for name in base)

    # What it trained on: the teacher's two turns of each conversation, in the student's format.
    policy = load_policy(student, "cpu")
    assert sft.teacher is not None
    row = sft.teacher.trajectories[0].rows[0]
    learned = [t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m]
    trained_text = policy.tokenizer.decode(learned)
    task = CALC["train"][0]
    expression = f"{task['a']}{task['op']}{task['b']}"
    call = f'{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}'
    assert f"<tool_call>\n{call}" in trained_text
    assert f"Answer: {task['answer']}" in trained_text
    assert task["question"] not in trained_text  # the prompt is context
    assert task["question"] in policy.tokenizer.decode(row.token_ids)


def test_a_teacher_run_with_nothing_usable_says_why_per_rollout(
    student: Path, teacher_run: tuple[Path, ScriptedOpenAIServer]
) -> None:
    teacher_dir, _ = teacher_run
    policy = load_policy(student, "cpu")
    with pytest.raises(ConfigError) as refused:
        asyncio.run(SFT(from_run=teacher_dir, min_reward=2.0).prepare(policy))
    lines = refused.value.message.splitlines()
    assert "no transcript the student can learn (0 of 0 transcripts rendered; not used: 4 x its" in lines[0]
    assert len(lines) == 5
    assert all("its reward is not among those the rule selects" in line for line in lines[1:])

    # A student whose chat template leaves tools out cannot render the teacher's calls.
    policy.tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}{{ eos_token if m.role == 'assistant' }}"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    with pytest.raises(ConfigError) as refused:
        asyncio.run(SFT(from_run=teacher_dir).prepare(policy))
    lines = refused.value.message.splitlines()
    assert len(lines) == 5
    assert all(
        "cannot render it: this model's chat template leaves tool definitions out" in line
        for line in lines[1:]
    ), lines


def test_rejection_sampling_learns_exactly_the_sampled_tokens_of_the_selected_rollouts(
    tmp_path: Path, student: Path
) -> None:
    run_dir = tmp_path / "run"
    sft = SFT(top_k=1, group_size=3, batch_tasks=2, max_steps=1, val_before_training=False, max_tokens=8)
    [line] = run(sft, run_dir, engine=engine(student)).fit(graded_call, TASKS)

    assert (line["rollouts"], line["rollouts_selected"], line["rollouts_not_selected"]) == (6, 2.0, 4.0)
    best = _best_of_each_group(run_dir)
    assert line["trained_tokens"] == sum(len(call.response_token_ids or []) for call in best)
    assert line["drift/calls_missing_ids"] == 0
    assert isinstance(line["loss"], float)


def _best_of_each_group(run_dir: Path) -> list[ModelCall]:
    """The model call of each group's best rollout (the earliest of equals), as recorded."""

    async def read() -> list[ModelCall]:
        store = SqliteStore(run_dir / "store.sqlite")
        try:
            groups: dict[str, list[tuple[float, int, ModelCall]]] = {}
            for order, rollout in enumerate(await store.query_rollouts(mode="train")):
                spans = await store.query_spans(rollout.rollout_id, "latest")
                reward = next(
                    s.attributes[semconv.ATTR_REWARD_VALUE] for s in spans if s.name == semconv.SPAN_REWARD
                )
                [call] = [s for s in spans if s.name == semconv.SPAN_MODEL_CALL]
                model_call = ModelCall.model_validate(call.attributes[semconv.ATTR_MODEL_CALL])
                groups.setdefault(rollout.group_id or "", []).append((reward, order, model_call))
            return [min(group, key=lambda item: (-item[0], item[1]))[2] for group in groups.values()]
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_step_whose_rule_selects_nothing_takes_no_update_and_counts_it(
    tmp_path: Path, student: Path
) -> None:
    run_dir = tmp_path / "run"
    sft = SFT(
        min_reward=10.0, group_size=2, batch_tasks=2, max_steps=1, val_before_training=False, max_tokens=8
    )
    [line] = run(sft, run_dir, engine=engine(student)).fit(graded_call, TASKS)
    assert (line["rollouts_selected"], line["rollouts_not_selected"], line["update_skipped"]) == (
        0.0,
        4.0,
        1.0,
    )
    assert "loss" not in line
    base = load_file(str(student / "model.safetensors"))
    published = load_file(str(run_dir / "checkpoints" / "step-1" / "model.safetensors"))
    assert all(torch.equal(base[name], published[name]) for name in base)


def test_sft_trains_a_lora_adapter_as_grpo_does(tmp_path: Path, student: Path) -> None:
    run_dir = tmp_path / "run"
    sft = SFT(
        top_k=1, group_size=2, batch_tasks=2, max_steps=1, val_before_training=False, max_tokens=8,
        lora=LoraConfig(rank=4),
    )  # fmt: skip
    [line] = run(sft, run_dir, engine=engine(student)).fit(graded_call, TASKS)
    assert line["rollouts_selected"] == 2.0
    assert line["model_version"] == 1
    assert (run_dir / "checkpoints" / "step-1" / "adapter_config.json").is_file()
    assert not (run_dir / "checkpoints" / "step-1" / "model.safetensors").exists()


def test_sft_settings_are_checked_early() -> None:
    with pytest.raises(ConfigError, match="SFT needs to know what to imitate"):
        SFT()
    with pytest.raises(ConfigError, match="top_k must be from 1 to group_size"):
        SFT(top_k=5, group_size=4)
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        SFT(from_run="x", batch_size=0)


def test_teacher_data_reports_a_transcript_the_template_cannot_render(student: Path) -> None:
    from fulgor.adapters.transcripts import Transcript

    policy = load_policy(student, "cpu")
    fine = Transcript.of([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    calls = [
        {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": json.dumps({"x": 1})}}
    ]
    no_tools = Transcript.of(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    )
    data = teacher_data([fine, no_tools], policy.tokenizer, stop_token_ids={policy.tokenizer.eos_token_id})
    assert len(data.trajectories) == 1
    [unusable] = data.unusable
    assert "do not parse back" in unusable.reason  # no tools were declared: the engine parses no calls


@pytest.mark.parametrize(
    ("template", "says"),
    [
        (  # drops the system message
            "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
            "{{ m.content or '' }}<|im_end|>\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "drops the system message 'Be brief.'",
        ),
        (  # renders only the newest assistant turn, so earlier turns change as the conversation grows
            "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}<|im_start|>{{ m.role }}\n"
            "{{ m.content or '' }}<|im_end|>\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "cannot render it: the chat template re-renders earlier turns",
        ),
    ],
    ids=["drops a message", "not append-only"],
)
def test_a_template_that_cannot_render_a_transcript_faithfully_is_reported(
    student: Path, template: str, says: str
) -> None:
    from fulgor.adapters.transcripts import Transcript

    policy = load_policy(student, "cpu")
    policy.tokenizer.chat_template = template
    conversation = Transcript.of(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "hello again"},
        ]
    )
    data = teacher_data([conversation], policy.tokenizer, stop_token_ids={policy.tokenizer.eos_token_id})
    assert data.trajectories == []
    [unusable] = data.unusable
    assert says in unusable.reason
