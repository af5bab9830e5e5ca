"""Trainer parts that need no services: agent specs, checkpoints, group signal, reports, metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fulgor import GRPO, Agent, rollout
from fulgor.adapters import DriftReport, Trajectory
from fulgor.errors import ConfigError
from fulgor.training.checkpoints import latest_checkpoint
from fulgor.training.reports import DevReport, MetricsLog, PhaseTimer, ProgressBar, RolloutReport
from fulgor.training.rollouts import (
    RolloutOutcome,
    agent_match_problem,
    groups_without_signal,
    requested_tools,
)
from fulgor.training.runners import agent_spec
from fulgor.training.tracking import start_tracking
from fulgor.types import JsonDict, ModelCall, Rollout


@rollout
def module_level_agent(task: Any) -> float:
    return 1.0


class StatefulAgent(Agent):
    def rollout(self, task: Any) -> float:
        return 0.0


def test_only_agents_another_process_can_import_as_themselves_get_a_spec() -> None:
    @rollout
    def local_agent(task: Any) -> float:
        return 1.0

    assert agent_spec(module_level_agent) == f"{__name__}:module_level_agent"
    assert agent_spec(local_agent) is None
    assert agent_spec(StatefulAgent()) is None
    # The same function wrapped again is not the object the module holds.
    assert agent_spec(rollout(module_level_agent.func)) is None


def test_latest_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "checkpoints") is None
    for name in ("step-2", "step-10", ".step-11.partial", "step-12", "notes"):
        (tmp_path / name).mkdir()
    for name in ("step-2", "step-10", ".step-11.partial"):
        (tmp_path / name / "config.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == (10, tmp_path / "step-10")


def trained(group: str, reward: float, index: int) -> RolloutOutcome:
    rollout = Rollout(
        rollout_id=f"{group}-{index}", input={}, group_id=group, status="succeeded", enqueue_time=0.0
    )
    trajectory = Trajectory(
        rollout_id=rollout.rollout_id, group_id=group, reward=reward, rows=[], model_versions=[]
    )
    return RolloutOutcome(rollout, reward, 1, trajectory)


def failed(group: str, index: int) -> RolloutOutcome:
    rollout = Rollout(
        rollout_id=f"{group}-{index}", input={}, group_id=group, status="failed", enqueue_time=0.0
    )
    return RolloutOutcome(rollout, None, 0, None, error="ValueError: boom")


def test_groups_without_signal_are_those_with_one_reward_or_fewer_than_two_trajectories() -> None:
    batch = [trained("a", 0.0, 0), trained("a", 1.0, 1), trained("b", 1.0, 0), trained("b", 1.0, 1)]
    batch.append(trained("c", 0.5, 0))
    assert groups_without_signal(batch) == 2
    batch += [failed("d", 0), failed("d", 1)]  # every rollout failed: nothing to learn from it either
    assert groups_without_signal(batch) == 3
    batch += [trained("e", 1.0, 0), failed("e", 1)]  # one trajectory: no group to compare it with
    assert groups_without_signal(batch) == 4


def outcome(status: str, reward: float | None, drift: DriftReport | None = None) -> RolloutOutcome:
    rollout = Rollout(rollout_id=f"ro-{status}", input={}, status=status, enqueue_time=0.0)  # type: ignore[arg-type]
    error = None if status == "succeeded" else "ValueError: boom"
    return RolloutOutcome(rollout, reward, 1, None, drift or DriftReport(calls_total=1), error)


def test_an_agent_match_that_matches_no_recorded_agent_names_the_agents_seen() -> None:
    def made(*agents: str | None) -> RolloutOutcome:
        return dataclasses.replace(trained("g", 1.0, 0), agent_names=agents)

    outcomes = [made("write_query", "check_query"), made("write_query", None)]
    problem = agent_match_problem("^writer$", outcomes)
    assert problem is not None
    assert "'check_query' (1 call), 'write_query' (2 calls), None (1 call)" in problem
    assert agent_match_problem("write|rewrite", outcomes) is None
    assert agent_match_problem(None, outcomes) is None
    assert agent_match_problem("^writer$", [made()]) is None  # no call at all: nothing to judge by
    with pytest.raises(ConfigError, match="not a regular expression"):
        GRPO(agent_match="write(")


def test_tool_calls_are_counted_from_the_recorded_responses() -> None:
    def recorded(response: dict[str, Any]) -> ModelCall:
        return ModelCall(request={}, response=response, prompt_token_ids=[1], response_token_ids=[2])

    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    two = recorded({"message": {"content": None, "tool_calls": [call, call]}})
    assert requested_tools(two) == [call, call]
    assert requested_tools(recorded({"message": {"content": "Answer: 4", "tool_calls": None}})) == []
    assert requested_tools(recorded({"text": "a completion"})) == []
    assert requested_tools(recorded({})) == []


def test_dev_report_lists_rollouts_with_their_problems() -> None:
    report = DevReport(
        [
            RolloutReport.from_outcome(outcome("succeeded", 1.0, DriftReport(calls_total=1, merge_breaks=2))),
            RolloutReport.from_outcome(outcome("failed", None)),
        ]
    )
    assert report.reward_mean == 1.0
    assert report.drift["merge_breaks"] == 2
    assert report.rollouts[0].problems == {"merge_breaks": 2}
    text = str(report)
    assert "merge_breaks=2" in text
    assert "ValueError: boom" in text
    assert "2 rollouts, 1 succeeded, reward mean 1.000" in text


def test_metrics_log_appends_one_json_line_per_step(tmp_path: Path) -> None:
    timer = PhaseTimer()
    with timer("update_policy"):
        pass
    log = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    log.write({"step": 1, "seconds": timer.seconds})
    log.write({"step": 2})
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert log.history[0]["seconds"]["update_policy"] >= 0


def test_metrics_that_are_not_finite_are_written_as_null(tmp_path: Path) -> None:
    nan, inf = float("nan"), float("inf")
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write(
        {"step": 1, "loss": nan, "kl": inf, "grad_norm": -inf, "seconds": {"update": nan}, "reward_mean": 0.5}
    )

    def strict(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    [line] = (tmp_path / "metrics.jsonl").read_text().splitlines()
    written = json.loads(line, parse_constant=strict)
    assert written == {
        "step": 1, "loss": None, "kl": None, "grad_norm": None, "seconds": {"update": None},
        "reward_mean": 0.5,
    }  # fmt: skip
    assert log.history == [written]


class RecordingTracker:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.finished = False

    def start(self, run_dir: Path, config: JsonDict) -> None:
        pass

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.logged.append((step, dict(metrics)))
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        self.finished = True


def test_a_tracker_that_cannot_log_is_reported_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    offline = RecordingTracker(ConnectionError("api.wandb.ai unreachable"))
    working = RecordingTracker()
    with caplog.at_level(logging.WARNING), start_tracking([offline, working], tmp_path, {}) as track:
        track({"step": 1, "reward_mean": 0.5})
        track({"step": 2, "reward_mean": 0.75})

    assert working.logged == [(1, {"reward_mean": 0.5}), (2, {"reward_mean": 0.75})]
    assert [step for step, _ in offline.logged] == [1, 2]  # still offered every step
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "RecordingTracker could not log step 1" in warning.getMessage()
    assert "api.wandb.ai unreachable" in warning.getMessage()
    assert offline.finished
    assert working.finished


def test_dev_and_evaluate_use_the_newest_checkpoint_without_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fulgor import GRPO, Trainer
    from fulgor.engine.local import EngineConfig

    class ServicesStarting(Exception):
        pass

    started: list[tuple[Path, int]] = []

    def start_services(self: Trainer, agent: Any, model_dir: Path, model_version: int) -> None:
        started.append((model_dir, model_version))
        raise ServicesStarting

    monkeypatch.setattr(Trainer, "start_services", start_services)
    trainer = Trainer(
        algorithm=GRPO(),
        engine=EngineConfig(model=tmp_path / "model"),
        run_dir=tmp_path / "run",
        resume=False,
    )
    checkpoint = tmp_path / "run" / "checkpoints" / "step-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")

    with pytest.raises(ServicesStarting):
        trainer.evaluate(module_level_agent, [{"q": 1}])
    with pytest.raises(ServicesStarting):
        trainer.dev(module_level_agent, [{"q": 1}])
    assert started == [(checkpoint, 3), (checkpoint, 3)]
    with pytest.raises(ConfigError, match="resume=True"):  # training on would still need resume
        trainer.fit(module_level_agent, [{"q": 1}])
    assert len(started) == 2


def test_trainer_refuses_bad_settings_before_starting_anything(tmp_path: Path) -> None:
    from fulgor import GRPO, Trainer
    from fulgor.engine.local import EngineConfig

    engine = EngineConfig(model=tmp_path / "model")
    with pytest.raises(ConfigError, match="n_runners"):
        Trainer(algorithm=GRPO(), engine=engine, n_runners=0)
    trainer = Trainer(algorithm=GRPO(), engine=engine, run_dir=tmp_path / "run", resume=False)
    with pytest.raises(ConfigError, match="empty"):
        trainer.fit(module_level_agent, [])
    (tmp_path / "run" / "checkpoints" / "step-3").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step-3" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="resume=True"):
        trainer.fit(module_level_agent, [{"q": 1}])


async def test_blocking_entry_points_work_inside_a_running_event_loop() -> None:
    from fulgor.training.trainer import _run_blocking

    async def work() -> int:
        await asyncio.sleep(0)
        return 3

    async def fails() -> int:
        raise ConfigError("no")

    assert _run_blocking(work()) == 3
    with pytest.raises(ConfigError, match="no"):
        _run_blocking(fails())


def test_the_progress_bar_on_stderr_shows_steps_reward_and_validation_accuracy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with ProgressBar(0, 3) as progress:
        progress.update({"step": 0, "val_accuracy": 0.25})  # the validation before training
        progress.update({"step": 1, "reward_mean": 0.5, "tool_call_rate": 0.125})
    out, err = capsys.readouterr()
    assert out == ""
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "1/3" in last
    assert "reward=0.500" in last
    assert "val=0.250" in last
    assert "tools=0.125" in last

    with ProgressBar(0, 3) as search:  # a prompt search's steps
        search.update({"step": 1, "best_score": 0.6})
    assert "best=0.600" in capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]

    with ProgressBar(0, 3, enabled=False) as quiet:  # Trainer(progress=False), or not a terminal
        quiet.update({"step": 1, "reward_mean": 0.5})
    assert capsys.readouterr() == ("", "")


async def test_a_rollout_that_lost_spans_is_not_trained_on_and_says_how_many() -> None:
    from fulgor import semconv
    from fulgor.store import MemoryStore
    from fulgor.training.rollouts import read_outcome
    from fulgor.types import RolloutRequest, Span

    store = MemoryStore()
    attempted = await store.start_rollout(RolloutRequest(input={}), worker_id="w")
    call = ModelCall(
        request={}, response={}, prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.1]
    )
    reward = {semconv.ATTR_REWARD_VALUE: 1.0}
    spans = [
        Span(rollout_id=attempted.rollout_id, attempt_id=attempted.attempt.attempt_id, trace_id="t",
             span_id=name, name=name, start_time=float(i), attributes=attributes)
        for i, (name, attributes) in enumerate(
            [(semconv.SPAN_MODEL_CALL, {semconv.ATTR_MODEL_CALL: call.model_dump(mode="json")}),
             (semconv.SPAN_REWARD, reward)]
        )
    ]  # fmt: skip
    await store.add_spans(spans)
    attempt_id = attempted.attempt.attempt_id
    await store.update_attempt(attempted.rollout_id, attempt_id, status="succeeded")
    rollout = await store.get_rollout(attempted.rollout_id)

    whole = await read_outcome(store, rollout)
    assert whole.trajectory is not None
    assert whole.drift.spans_lost == 0

    await store.update_attempt(rollout.rollout_id, attempt_id, metadata={semconv.ATTEMPT_SPANS_LOST: 2})
    for gateway_lost, total in ((0, 2), (1, 3)):
        partial = await read_outcome(store, rollout, spans_lost=gateway_lost)
        assert partial.trajectory is None
        assert partial.drift.spans_lost == total
        assert f"{total} of its spans were not stored" in str(partial.error)
    assert "spans_lost" in DriftReport.LOSSES
