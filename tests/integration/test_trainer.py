"""The Trainer end to end on a tiny local model: dev runs, two GRPO steps, clean shutdown.

Everything is real: the engine, the store server and gateway on loopback, runner processes (or
in-process runners for an agent they cannot import), weight swaps between steps.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from sample_agents.chat_agent import graded_call, one_call
from tests.process_support import command_line, descendants
from tests.tracking_support import tensorboard_scalars, wandb_history

from fulgor import GRPO, LLM, Trainer, rollout, semconv
from fulgor.adapters import DriftReport
from fulgor.algorithms.grpo import GRPOConfig
from fulgor.algorithms.grpo.update import token_logprobs
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError, ValidationError
from fulgor.store import MemoryStore, SqliteStore
from fulgor.store.base import Store
from fulgor.training.services import Services
from fulgor.training.tracking import TensorBoardTracker, Tracker, WandbTracker
from fulgor.types import ModelCall, Rollout
from fulgor.weights.loading import load_model
from fulgor.weights.lora import LoraConfig
from fulgor.weights.policy import load_training_state

TASKS = [
    {"prompt": "Say a word.", "letter": "e"},
    {"prompt": "Name a colour.", "letter": "a"},
    {"prompt": "Count to three.", "letter": "o"},
]
PROBLEMS = (*DriftReport.LOSSES, "merge_breaks")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("trainer") / "tiny", "tiny", seed=0)


def make_trainer(
    run_dir: Path,
    model_dir: Path,
    max_steps: int = 2,
    trackers: Sequence[Tracker] = (),
    learning_rate: float = 1e-3,
    store: Store | None = None,
    keep_checkpoints: int = 2,
    **options: Any,
) -> Trainer:
    algorithm = GRPO(
        group_size=2, batch_tasks=2, max_steps=max_steps, val_every=2, max_tokens=8,
        config=GRPOConfig(learning_rate=learning_rate), **options,
    )  # fmt: skip
    engine = EngineConfig(model=model_dir, device="cpu", max_model_len=256, seed=0)
    return Trainer(
        algorithm=algorithm, engine=engine, run_dir=run_dir, n_runners=2, max_concurrency=4, torch_threads=2,
        trackers=trackers, store=store, keep_checkpoints=keep_checkpoints,
    )  # fmt: skip


def leftover_processes() -> set[str]:
    """Command lines of every live process below this one."""
    commands = {command_line(pid) for pid in descendants(os.getpid())}
    return {command for command in commands if command is not None}


def assert_closed(url: str) -> None:
    parts = urlsplit(url)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((parts.hostname or "", parts.port or 0), timeout=1).close()


def optimizer_state(checkpoint: Path) -> dict[str, Any]:
    state = load_training_state(checkpoint)
    assert state is not None
    optimizer: dict[str, Any] = state["updater"]["optimizer"]
    return optimizer


def read_store(path: Path) -> tuple[list[Rollout], dict[str, list[ModelCall]], list[LLM]]:
    async def read() -> tuple[list[Rollout], dict[str, list[ModelCall]], list[LLM]]:
        store = SqliteStore(path)
        rollouts = await store.query_rollouts()
        calls = {}
        for each in rollouts:
            spans = await store.query_spans(each.rollout_id, name=semconv.SPAN_MODEL_CALL)
            calls[each.rollout_id] = [
                ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans
            ]
        latest = await store.get_resources()
        await store.close()
        assert latest is not None
        llm = latest.resources["llm"]
        assert isinstance(llm, LLM)
        return rollouts, calls, [llm]

    return asyncio.run(read())


def test_dev_runs_each_task_once_and_reports_it(tmp_path: Path, model_dir: Path) -> None:
    # Defined here, so runner processes could not import it: it runs in-process.
    @rollout
    async def local_agent(task: dict[str, Any], llm: LLM) -> float:
        reward: float = await one_call(task, llm)
        return reward

    report = make_trainer(tmp_path / "run", model_dir).dev(local_agent, TASKS)

    assert [r.status for r in report.rollouts] == ["succeeded"] * 3
    assert [r.model_calls for r in report.rollouts] == [1, 1, 1]
    assert all(r.reward in (0.0, 1.0) for r in report.rollouts)
    assert all(not r.problems for r in report.rollouts)
    assert report.drift["calls_trained"] == 3
    assert "3 rollouts, 3 succeeded" in str(report)
    assert leftover_processes() == set()


def test_fit_runs_two_steps_publishes_weights_and_leaves_nothing_behind(
    tmp_path: Path, model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    # graded_call: every group has a gradient, so every step takes an optimiser step (a step whose
    # advantages are all 0 takes none) and the optimiser state below counts them.
    history = make_trainer(run_dir, model_dir).fit(graded_call, TASKS, TASKS[:2])

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines == history
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert [line["model_version"] for line in lines] == [0, 1, 2]
    # Step 0 is the validation before training: the curve's starting point.
    assert 0.0 <= lines[0]["val_accuracy"] <= 1.0
    assert lines[0]["val_tool_call_rate"] == 0.0  # the agent offers no tools
    assert lines[0]["val_rollouts_failed"] == lines[2]["val_rollouts_failed"] == 0
    rollouts, calls, [llm] = read_store(run_dir / "store.sqlite")
    assert 0 < lines[1]["elapsed_seconds"] < lines[2]["elapsed_seconds"]
    for line in lines[1:]:
        assert line["rollouts"] == 4
        assert line["rollouts_failed"] == 0, [r.status for r in rollouts]
        for key in (
            "reward_mean",
            "loss",
            "entropy",
            "clip_fraction",
            "importance_weight_mean",
            "tokens_per_second",
        ):
            assert isinstance(line[key], float), key
        for phase in ("collect_rollouts", "build_trajectories", "update_policy", "publish_weights"):
            assert line[f"seconds/{phase}"] > 0
        assert all(line[f"drift/{name}"] == 0 for name in PROBLEMS)
        assert line["drift/calls_trained"] == 4
        assert line["tool_call_rate"] == 0.0
    assert "val_accuracy" not in lines[1]
    assert 0.0 <= lines[2]["val_accuracy"] <= 1.0
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1", "step-2"]
    runner_log = (run_dir / "logs" / "runners.log").read_text()
    assert "/chat/completions" in runner_log  # the agent ran in runner processes
    assert "Warning" not in runner_log

    train = [r for r in rollouts if r.mode == "train"]
    by_step = {step: [r for r in train if r.metadata["step"] == step] for step in (1, 2)}
    assert [len(by_step[1]), len(by_step[2])] == [4, 4]
    assert len({r.group_id for r in by_step[1]}) == 2
    # Each step ran on its own resources version and on the weights published before it.
    assert len({r.resources_id for r in by_step[1]}) == 1
    assert {r.resources_id for r in by_step[1]}.isdisjoint({r.resources_id for r in by_step[2]})
    assert {c.model_version for r in by_step[1] for c in calls[r.rollout_id]} == {0}
    assert {c.model_version for r in by_step[2] for c in calls[r.rollout_id]} == {1}
    val = [r for r in rollouts if r.mode == "val"]
    assert len(val) == 4
    assert sorted(c.model_version for r in val for c in calls[r.rollout_id]) == [0, 0, 2, 2]

    # Nothing left: no child process, no listening port.
    assert leftover_processes() == set()
    assert_closed(llm.endpoint)
    replicas = {c.engine_replica for cs in calls.values() for c in cs}
    for replica in replicas:
        assert replica is not None
        assert_closed(replica)

    # Each checkpoint holds the optimiser state, and a resumed trainer's updater starts from it.
    saved = optimizer_state(run_dir / "checkpoints" / "step-2")
    assert {float(state["step"]) for state in saved["state"].values()} == {2.0}
    _, updater = make_trainer(run_dir, model_dir)._trainable(run_dir / "checkpoints" / "step-2", 2)
    restored = updater.optimizer.state_dict()
    assert restored["state"].keys() == saved["state"].keys()
    for key, state in saved["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(restored["state"][key][name], state[name])

    # A new trainer on the same run directory continues after the newest checkpoint.
    resumed = make_trainer(run_dir, model_dir, max_steps=3).fit(graded_call, TASKS, TASKS[:2])
    assert [line["step"] for line in resumed] == [3]
    assert resumed[0]["model_version"] == 3
    assert resumed[0]["elapsed_seconds"] > lines[2]["elapsed_seconds"]  # the run's time, not the session's
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
    assert (run_dir / "checkpoints" / "step-3" / "config.json").is_file()
    # Step 1 was never validated and is no longer among the newest two: it is deleted.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-2", "step-3"]
    third = optimizer_state(run_dir / "checkpoints" / "step-3")
    assert {float(state["step"]) for state in third["state"].values()} == {3.0}  # 2 restored + 1
    assert leftover_processes() == set()


def test_fit_sends_every_metric_to_tensorboard_and_wandb(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    trackers = (TensorBoardTracker(), WandbTracker(project="tests"))

    make_trainer(run_dir, model_dir, trackers=trackers).fit(one_call, TASKS, TASKS[:2])

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected = {
        line["step"]: {k: v for k, v in line.items() if k != "step" and v is not None} for line in lines
    }
    assert sorted(expected) == [0, 1, 2]
    assert "val_accuracy" in expected[2]
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    for step, metrics in expected.items():
        logged = {tag: values[step] for tag, values in scalars.items() if step in values}
        assert logged == pytest.approx(metrics, rel=1e-6)
    run_id = (run_dir / "wandb_run_id").read_text()
    [run_file] = (tmp_path / "wandb-dir" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    assert wandb_history(run_file) == expected
    assert leftover_processes() == set()


def served_logprobs(model_dir: Path, call: ModelCall) -> list[float]:
    """The logprobs the model in ``model_dir`` (as the engine loads it) gives the call's response."""
    ids = torch.tensor([call.prompt_token_ids + call.response_token_ids])
    model = load_model(model_dir, device="cpu", dtype="float32").model
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, ids, torch.ones_like(ids))
    return logprobs[0, -len(call.response_token_ids) :].tolist()


def test_fit_with_lora_publishes_adapters_the_engine_serves_and_resumes(
    tmp_path: Path, model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    lora = LoraConfig(rank=4)
    trainer = make_trainer(run_dir, model_dir, 1, learning_rate=2e-2, lora=lora, val_before_training=False)
    [line] = trainer.fit(graded_call, TASKS, TASKS[:1])

    assert (line["model_version"], line["rollouts_failed"], line["groups_without_signal"]) == (1, 0, 0)
    saved = {p.name for p in (run_dir / "checkpoints" / "step-1").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "training_state.pt"} <= saved
    assert not {"config.json", "model.safetensors"} & saved  # only the adapter
    # Validation ran on the engine's base + the swapped-in adapter: it sampled from exactly that model.
    rollouts, calls, _ = read_store(run_dir / "store.sqlite")
    [val_call] = [c for r in rollouts if r.mode == "val" for c in calls[r.rollout_id]]
    assert val_call.model_version == 1
    assert val_call.response_logprobs is not None
    served = served_logprobs(run_dir / "checkpoints" / "step-1", val_call)
    base = served_logprobs(model_dir, val_call)
    assert served == pytest.approx(val_call.response_logprobs, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(base, val_call.response_logprobs, strict=True)) > 1e-3

    # The run continues from its adapter (the engine starts on it), with its optimiser state.
    [line] = make_trainer(run_dir, model_dir, 2, learning_rate=2e-2, lora=lora).fit(graded_call, TASKS)
    assert line["model_version"] == 2
    rollouts, calls, _ = read_store(run_dir / "store.sqlite")
    assert {
        c.model_version for r in rollouts if r.metadata.get("step") == 2 for c in calls[r.rollout_id]
    } == {1}
    assert (run_dir / "checkpoints" / "step-2" / "adapter_model.safetensors").is_file()
    second = optimizer_state(run_dir / "checkpoints" / "step-2")
    assert {float(state["step"]) for state in second["state"].values()} == {2.0}
    with pytest.raises(ConfigError, match="holds a LoRA adapter"):
        make_trainer(run_dir, model_dir, 3).fit(graded_call, TASKS)
    assert leftover_processes() == set()


async def a_call_recorded(store: Store, step: int) -> None:
    """Wait until the gateway has recorded a model call of one of ``step``'s training rollouts."""
    for _ in range(1200):
        for each in await store.query_rollouts(mode="train"):
            if each.metadata.get("step") == step and await store.query_spans(
                each.rollout_id, name=semconv.SPAN_MODEL_CALL
            ):
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no model call of step {step} was recorded within 60s")


def test_async_rollouts_overlap_the_update_and_drop_the_stale_ones(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Left to timing, step N+1's rollouts may all call the engine after step N's weights are
    # swapped in (a tiny model updates fast), and none is stale. So step N's publish_weights first
    # waits until a call of step N+1 is recorded: that call was served before the swap, by the
    # weights step N started from (version N-1), and step N+1's update (of version N) drops it as
    # stale: each step after the first has a stale rollout, whatever the timing. Nothing else
    # changes: the rollouts still run while the update trains, and the swap still comes under them.
    publish_weights = Trainer.publish_weights

    async def publish_once_the_next_step_has_called(
        self: Trainer, services: Services, policy: Any, updater: Any, step: int
    ) -> Any:
        if step < self.algorithm.max_steps:
            await a_call_recorded(services.store, step + 1)
        return await publish_weights(self, services, policy, updater, step)

    monkeypatch.setattr(Trainer, "publish_weights", publish_once_the_next_step_has_called)
    run_dir = tmp_path / "run"
    trainer = make_trainer(
        run_dir, model_dir, 3, learning_rate=1e-2, keep_checkpoints=0, async_rollouts=True, max_staleness=0
    )  # every checkpoint stays, for the checks below
    history = trainer.fit(graded_call, TASKS)

    assert [line["model_version"] for line in history] == [1, 2, 3]
    assert all(line["rollouts_failed"] == 0 for line in history)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3"]
    rollouts, calls, _ = read_store(run_dir / "store.sqlite")
    by_step = {step: [r for r in rollouts if r.metadata["step"] == step] for step in (1, 2, 3)}
    for step in (2, 3):
        # Step N's rollouts were all enqueued before step N-1's update was saved: they ran during it
        # (when step N-1 had something to train on; all stale, it publishes at once).
        if "loss" in history[step - 2]:
            # (the weights are written once the update is done; only the newest keeps its optimiser state)
            saved = (run_dir / "checkpoints" / f"step-{step - 1}" / "model.safetensors").stat().st_mtime
            assert max(r.enqueue_time for r in by_step[step]) < saved, step
    for line in history:
        # The policy updated at step N is version N-1; max_staleness=0 drops every rollout with a
        # call on older weights, as the calls recorded them.
        step = line["step"]
        versions = {
            r.rollout_id: [-1 if c.model_version is None else c.model_version for c in calls[r.rollout_id]]
            for r in by_step[step]
        }
        assert set().union(*versions.values()) <= {step - 2, step - 1}  # one step ahead at most
        assert line["rollouts_stale"] == sum(1 for v in versions.values() if min(v) < step - 1)
    assert "loss" in history[0]
    assert history[0]["rollouts_stale"] == 0
    # Steps 2 and 3 each had a rollout served by the weights before the update (see above).
    assert history[1]["rollouts_stale"] > 0, history
    assert history[2]["rollouts_stale"] > 0, history

    # Weights swapped under running rollouts: a call sampled from exactly the weights its version names.
    call = calls[by_step[3][0].rollout_id][0]
    assert call.response_logprobs is not None
    served = served_logprobs(run_dir / "checkpoints" / f"step-{call.model_version}", call)
    assert served == pytest.approx(call.response_logprobs, abs=1e-4)
    assert leftover_processes() == set()


@pytest.mark.parametrize("async_rollouts", [False, True])
def test_max_seconds_stops_after_the_step_that_used_them_up_and_validates_it(
    tmp_path: Path, model_dir: Path, async_rollouts: bool
) -> None:
    run_dir = tmp_path / "run"
    options = {"max_seconds": 1e-3, "val_before_training": False, "async_rollouts": async_rollouts}
    history = make_trainer(run_dir, model_dir, 50, **options).fit(graded_call, TASKS, TASKS[:1])

    assert [line["step"] for line in history] == [1]
    assert "val_accuracy" in history[0]  # not a validation step by val_every, but the last one
    assert history[0]["elapsed_seconds"] >= 1e-3
    # No training rollouts were started for a step that will not run (async mode included).
    rollouts, _, _ = read_store(run_dir / "store.sqlite")
    assert {r.metadata["step"] for r in rollouts if r.mode == "train"} == {1}
    # Resumed, the run's time is still used up: nothing more trains.
    again = make_trainer(run_dir, model_dir, 50, **options)
    assert again.fit(graded_call, TASKS, TASKS[:1]) == []
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    assert leftover_processes() == set()


def test_dev_shows_why_rollouts_failed(tmp_path: Path, model_dir: Path) -> None:
    @rollout
    async def broken_agent(task: dict[str, Any], llm: LLM) -> float:
        raise ValueError(f"no tool for {task['prompt']!r}")

    report = make_trainer(tmp_path / "run", model_dir).dev(broken_agent, TASKS[:1])

    [only] = report.rollouts
    assert only.status == "failed"
    assert only.reward is None
    assert "ValueError: no tool for 'Say a word.'" in (only.error or "")
    assert "failed" in str(report)


def test_evaluate_counts_the_rollouts_that_failed(tmp_path: Path, model_dir: Path) -> None:
    @rollout
    async def fails_on_purpose(task: dict[str, Any], llm: LLM) -> float:
        if task.get("fail"):
            raise ValueError("this task fails on purpose")
        await one_call(task, llm)
        return 1.0

    tasks = [*TASKS[:2], {"fail": True}]
    metrics = make_trainer(tmp_path / "run", model_dir).evaluate(fails_on_purpose, tasks)

    assert set(metrics) == {"val_accuracy", "val_tool_call_rate", "val_tool_calls", "val_rollouts_failed"}
    assert metrics["val_rollouts_failed"] == 1
    assert metrics["val_accuracy"] == pytest.approx(2 / 3)  # the failed one counts 0
    rollouts, _, _ = read_store(tmp_path / "run" / "store.sqlite")
    assert sorted(r.status for r in rollouts) == ["failed", "succeeded", "succeeded"]
    assert leftover_processes() == set()


def test_a_session_that_cannot_start_leaves_nothing_running(tmp_path: Path) -> None:
    from fulgor.weights.errors import ModelLoadError

    trainer = make_trainer(tmp_path / "run", tmp_path / "no-model")
    with pytest.raises(ModelLoadError):
        trainer.fit(one_call, TASKS)
    assert leftover_processes() == set()
    assert not list((tmp_path / "run").glob("checkpoints/*"))


def test_time_running_out_while_the_next_step_collects_ahead_cancels_its_rollouts(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Time is left when step 1 starts and when step 2's rollouts start (while step 1 trains); it is
    # up once step 1 has published. Step 2's rollouts hang meanwhile: they must end cancelled, not
    # stay queued or running for the next session's runners.
    answers = iter([False, False])
    monkeypatch.setattr(GRPO, "out_of_time", lambda self, elapsed_seconds: next(answers, True))
    calls = itertools.count()

    @rollout
    async def stalls_after_step_one(task: dict[str, Any], llm: LLM) -> float:
        if next(calls) >= 4:  # step 1: 2 tasks x 2 rollouts
            await asyncio.sleep(600)
        reward: float = await one_call(task, llm)
        return reward

    run_dir = tmp_path / "run"
    history = make_trainer(run_dir, model_dir, 50, async_rollouts=True).fit(stalls_after_step_one, TASKS)

    assert [line["step"] for line in history] == [1]
    rollouts, _, _ = read_store(run_dir / "store.sqlite")
    statuses = {step: [r.status for r in rollouts if r.metadata["step"] == step] for step in (1, 2)}
    assert statuses == {1: ["succeeded"] * 4, 2: ["cancelled"] * 4}
    assert leftover_processes() == set()


def test_a_store_passed_in_stays_open_for_the_next_session(tmp_path: Path, model_dir: Path) -> None:
    store = MemoryStore()
    trainer = make_trainer(tmp_path / "run", model_dir, store=store)

    report = trainer.dev(one_call, TASKS[:1])
    validation = trainer.evaluate(one_call, TASKS[:1])

    assert [r.status for r in report.rollouts] == ["succeeded"]
    assert 0.0 <= validation["val_accuracy"] <= 1.0
    assert [r.mode for r in asyncio.run(store.query_rollouts())] == ["test", "val"]  # still open
    asyncio.run(store.close())
    assert not (tmp_path / "run" / "store.sqlite").exists()
    assert leftover_processes() == set()


def test_a_session_that_fails_once_started_leaves_nothing_running(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[Services, set[str]]] = []

    async def put_resources(self: Trainer, services: Services) -> None:
        started.append((services, leftover_processes()))
        raise RuntimeError("failed once every service runs")

    monkeypatch.setattr(Trainer, "put_resources", put_resources)
    with pytest.raises(RuntimeError, match="failed once every service runs"):
        make_trainer(tmp_path / "run", model_dir).fit(one_call, TASKS)

    [(services, running)] = started
    assert any("fulgor.training._pool" in command for command in running)  # runner processes ran
    assert leftover_processes() == set()
    assert_closed(services.server_url)
    assert_closed(services.engine_url)
    with pytest.raises(ValidationError, match="the store is closed"):  # the store the trainer opened
        asyncio.run(services.store.query_rollouts())


def test_the_template_the_engine_serves_is_the_one_the_checkpoints_carry(
    tmp_path: Path, model_dir: Path
) -> None:
    """With ``EngineConfig(chat_template=...)`` the trainer's copy, and so every checkpoint, carries
    the template the engine renders with, not the model's own."""
    from fulgor.engine.chat_format import SHIPPED_TEMPLATES

    own = tmp_path / "own"
    shutil.copytree(model_dir, own)
    (own / "chat_template.jinja").write_text("{#- the model's own -#}" + SHIPPED_TEMPLATES["chatml-tools"])
    engine = EngineConfig(model=own, device="cpu", chat_template="chatml-tools")
    trainer = Trainer(algorithm=GRPO(group_size=2, max_steps=1), engine=engine, run_dir=tmp_path / "run")
    policy, _ = trainer._trainable(own, 0)
    saved = policy.save(tmp_path / "checkpoints", 1)
    assert (saved / "chat_template.jinja").read_text() == SHIPPED_TEMPLATES["chatml-tools"]
