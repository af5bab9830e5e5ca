"""The text-to-SQL example's LangGraph agent, unchanged, through the real gateway and local engine.

Every recorded call must carry the name of the LangGraph node that made it (from the agent's own
OpenTelemetry spans, or from an X-Fulgor-Agent header) and the engine's exact token ids.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("langgraph")

from agents.sql_agents import always_rewrite, never_stops

from examples.sql.agent import AGENTS, sql_agent, sql_agent_headers
from examples.sql.database import build_database
from examples.sql.dataset import make_splits
from fulgor import GRPO, Trainer
from fulgor.adapters import DriftReport, model_calls, rollout_feedback, rollout_reward
from fulgor.agent.base import Runnable
from fulgor.engine.loading import load_model
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.engine.prompts import chat_prompt_ids
from fulgor.engine.protocol import ChatCompletionRequest
from fulgor.errors import ConfigError
from fulgor.store import SqliteStore
from fulgor.types import ModelCall, Span


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("sql")
    database = build_database(root / "company.sqlite")
    tasks = [{**task, "database": str(database)} for task in make_splits(0, (4, 1, 1))["train"]]
    return init_model(root / "tiny", "tiny", seed=0), tasks


def trainer(run_dir: Path, model_dir: Path, **options: Any) -> Trainer:
    engine = EngineConfig(model=model_dir, device="cpu", max_model_len=512, seed=0)
    algorithm = GRPO(group_size=2, batch_tasks=2, max_tokens=12, val_before_training=False, **options)
    return Trainer(algorithm=algorithm, engine=engine, run_dir=run_dir, n_runners=1, torch_threads=1)


def run(tmp_path: Path, model_dir: Path, agent: Runnable, tasks: list[dict[str, Any]]) -> list[list[Span]]:
    report = trainer(tmp_path / "run", model_dir).dev(agent, tasks)
    assert all(r.status == "succeeded" for r in report.rollouts), report

    async def read() -> list[list[Span]]:
        store = SqliteStore(tmp_path / "run" / "store.sqlite")
        try:
            return [list(await store.query_spans(r.rollout_id)) for r in await store.query_rollouts()]
        finally:
            await store.close()

    return asyncio.run(read())


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
