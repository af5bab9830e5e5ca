"""The text-to-SQL example's LangGraph agent, unchanged, through the real gateway and local engine.

Every recorded call must carry the name of the LangGraph node that made it (from the agent's own
OpenTelemetry spans, or from an X-Fulgor-Agent header) and the engine's exact token ids.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("langgraph")

from safetensors.torch import load_file
from sample_agents.sql_agents import always_rewrite, graded_rewrites, never_stops

from examples.sql.agent import AGENTS, sql_agent, sql_agent_headers
from examples.sql.database import build_database
from examples.sql.dataset import make_splits
from fulgor import GRPO, Trainer
from fulgor.adapters import DriftReport, model_calls, rollout_feedback, rollout_reward
from fulgor.agent.base import Runnable
from fulgor.algorithms.grpo import GRPOConfig
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.engine.prompts import chat_prompt_ids
from fulgor.engine.protocol import ChatCompletionRequest
from fulgor.errors import ConfigError
from fulgor.store import SqliteStore
from fulgor.types import ModelCall, Span
from fulgor.weights.loading import load_model
from fulgor.weights.lora import LoraConfig


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("sql")
    database = build_database(root / "company.sqlite")
    tasks = [{**task, "database": str(database)} for task in make_splits(0, (4, 1, 1))["train"]]
    return init_model(root / "tiny", "tiny", seed=0), tasks


def trainer(
    run_dir: Path, model_dir: Path, *, learning_rate: float = 1e-3, resume: bool = False, **options: Any
) -> Trainer:
    engine = EngineConfig(model=model_dir, device="cpu", max_model_len=512, seed=0)
    config = GRPOConfig(learning_rate=learning_rate)
    algorithm = GRPO(
        group_size=2, batch_tasks=2, max_tokens=12, val_before_training=False, config=config, **options
    )
    return Trainer(
        algorithm=algorithm, engine=engine, run_dir=run_dir, n_runners=1, torch_threads=1, resume=resume
    )


def read_all(run_dir: Path) -> list[list[Span]]:
    async def read() -> list[list[Span]]:
        store = SqliteStore(run_dir / "store.sqlite")
        try:
            return [list(await store.query_spans(r.rollout_id)) for r in await store.query_rollouts()]
        finally:
            await store.close()

    return asyncio.run(read())


def run(tmp_path: Path, model_dir: Path, agent: Runnable, tasks: list[dict[str, Any]]) -> list[list[Span]]:
    report = trainer(tmp_path / "run", model_dir).dev(agent, tasks)
    assert all(r.status == "succeeded" for r in report.rollouts), report
    return read_all(tmp_path / "run")


def assert_engine_ids(call: ModelCall, tokenizer: Any) -> None:
    """The recorded ids are the engine's: the prompt is the request rendered by the model's chat
    template, and the response ids decode to the text the agent was given."""
    assert not call.token_ids_missing
    assert call.response_token_ids
    assert call.response_logprobs
    assert len(call.response_logprobs) == len(call.response_token_ids)
    request = ChatCompletionRequest.model_validate(call.request)
    assert call.prompt_token_ids == chat_prompt_ids(tokenizer, request)
    text = call.response["message"]["content"]
    assert text
    assert tokenizer.decode(call.response_token_ids, skip_special_tokens=True) == text


def names(spans: list[Span]) -> list[str | None]:
    return [call.agent_name for _, call in model_calls(spans)]


def test_every_call_is_named_by_its_node_from_the_agents_own_spans(tmp_path: Path, setup: Any) -> None:
    model_dir, tasks = setup
    tokenizer = load_model(model_dir, device="cpu").tokenizer
    rollouts = run(tmp_path, model_dir, sql_agent, tasks[:2])
    for spans in rollouts:
        called = names(spans)
        assert called[:2] == ["write_query", "check_query"]
        assert set(called) <= set(AGENTS)
        for _, call in model_calls(spans):
            assert call.agent_name is not None
            assert_engine_ids(call, tokenizer)
        raw = [s for s in spans if s.name == "fulgor.model_call"]
        assert all(s.parent_id for s in raw)  # each call's traceparent points into the agent's spans
        assert rollout_reward(spans) == 0.0  # an untrained model writes no working query
        assert rollout_feedback(spans)


def test_headers_name_the_same_agents_and_rewrites_run_to_the_round_limit(tmp_path: Path, setup: Any) -> None:
    model_dir, tasks = setup
    [headed] = run(tmp_path / "headers", model_dir, sql_agent_headers, tasks[:1])
    assert names(headed)[:2] == ["write_query", "check_query"]
    assert all(call.agent_name for _, call in model_calls(headed))
    [rewritten] = run(tmp_path / "rewrite", model_dir, always_rewrite, tasks[:1])
    assert names(rewritten) == ["write_query", "check_query", *["rewrite_query", "check_query"] * 2]
    assert "ran past" not in (rollout_feedback(rewritten) or "")  # three rounds are within the limit


def test_a_graph_that_loops_past_its_round_limit_scores_zero_and_says_why(tmp_path: Path, setup: Any) -> None:
    model_dir, tasks = setup
    [looped] = run(tmp_path, model_dir, never_stops, tasks[:1])
    assert rollout_reward(looped) == 0.0
    assert "ran past its limit of 3 rounds" in (rollout_feedback(looped) or "")


def test_agent_match_trains_the_writer_and_rewriter_and_counts_the_checker_apart(
    tmp_path: Path, setup: Any
) -> None:
    model_dir, tasks = setup
    [metrics] = trainer(tmp_path, model_dir, max_steps=1, agent_match="write|rewrite").fit(
        always_rewrite, tasks
    )
    # Each rollout: the writer once and the rewriter twice (trained), the checker three times (not).
    assert metrics["drift/calls_total"] == 4 * 6
    assert metrics["drift/calls_not_matched"] == 4 * 3
    assert metrics["drift/calls_trained"] == 4 * 3
    assert all(metrics[f"drift/{name}"] == 0 for name in DriftReport.LOSSES)


def test_an_agent_match_that_matches_no_agent_stops_the_first_step_naming_the_agents(
    tmp_path: Path, setup: Any
) -> None:
    model_dir, tasks = setup
    with pytest.raises(ConfigError, match="agent_match '\\^writer\\$' matches none") as failure:
        trainer(tmp_path, model_dir, max_steps=3, agent_match="^writer$").fit(sql_agent, tasks)
    assert "'check_query'" in failure.value.message
    assert "'write_query'" in failure.value.message
    assert not (tmp_path / "checkpoints").exists()  # stopped before any update


def test_one_adapter_per_agent_is_served_routed_trained_and_resumed_apart(tmp_path: Path, setup: Any) -> None:
    model_dir, tasks = setup
    adapters = {"write": LoraConfig(rank=4), "rewrite": LoraConfig(rank=2)}
    history = trainer(tmp_path, model_dir, max_steps=2, adapters=adapters, learning_rate=5e-2).fit(
        graded_rewrites, tasks
    )
    assert [m["step"] for m in history] == [1, 2]
    for metrics in history:  # each adapter learns from its own agent's calls
        assert metrics["trained_tokens/write"] > 0
        assert metrics["trained_tokens/rewrite"] > 0
        assert metrics["drift/calls_not_matched"] == 4 * 3  # the checker: served by the base, not trained
    assert any(m["grad_norm/write"] > 0 for m in history)
    assert any(m["grad_norm/rewrite"] > 0 for m in history)
    checkpoint = tmp_path / "checkpoints" / "step-2"
    assert json.loads((checkpoint / "adapters.json").read_text())["adapters"] == ["write", "rewrite"]
    write, rewrite = (
        load_file(checkpoint / name / "adapter_model.safetensors") for name in ("write", "rewrite")
    )
    assert {t.shape[0] for k, t in write.items() if "lora_A" in k} == {4}
    assert {t.shape[0] for k, t in rewrite.items() if "lora_A" in k} == {2}
    assert any(bool(t.abs().sum() > 0) for k, t in write.items() if "lora_B" in k)  # moved from zero
    assert any(bool(t.abs().sum() > 0) for k, t in rewrite.items() if "lora_B" in k)

    def served(spans: list[Span]) -> list[tuple[str | None, str, int | None]]:
        return [(c.agent_name, c.request["model"], c.model_version) for _, c in model_calls(spans)]

    calls = [call for spans in read_all(tmp_path) for call in served(spans)]
    base = model_dir.name
    assert {(agent, model) for agent, model, _ in calls} == {
        ("write_query", f"{base}-write"),
        ("check_query", base),
        ("rewrite_query", f"{base}-rewrite"),
    }
    # Step 1 ran on the fresh adapters (version 0), step 2 on the first update; the base never changes.
    assert {version for agent, _, version in calls if agent != "check_query"} == {0, 1}
    assert {version for agent, _, version in calls if agent == "check_query"} == {0}

    resumed = trainer(tmp_path, model_dir, max_steps=3, adapters=adapters, learning_rate=5e-2, resume=True)
    assert [m["step"] for m in resumed.fit(graded_rewrites, tasks)] == [3]
    assert (tmp_path / "checkpoints" / "step-3" / "rewrite" / "adapter_config.json").is_file()
    with pytest.raises(ConfigError, match="one LoRA adapter per agent"):
        trainer(tmp_path, model_dir, max_steps=4, resume=True).fit(always_rewrite, tasks)
