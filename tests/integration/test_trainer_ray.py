"""The Trainer with its runners as Ray actors (``Trainer(runners=RayRunners())``) on a Ray instance
the session starts: GRPO trains through them, a runner that dies mid-rollout leaves the rollout to
another, and nothing of Ray outlives the session."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray", reason="the ray extra is installed by make test")

import ray
from tests.integration.sample_agents.slow_agent import kills_its_runner_first_time, sleeper

from examples.calc.agent import calc_agent
from examples.calc.dataset import make_splits
from fulgor import GRPO, RayRunners, RolloutConfig, Trainer
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.openai_server import ScriptedOpenAIServer

RAY_PROCESSES = ("ray::", "raylet", "gcs_server")


def ray_processes() -> list[str]:
    """Ray's live processes; a zombie (``<defunct>``: ended, its entry not yet reaped by the parent
    it was handed to, which in a container may be an init that never reaps) runs nothing."""
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [
        line
        for line in listing.splitlines()
        if any(name in line for name in RAY_PROCESSES) and "<defunct>" not in line
    ]


async def attempts_of(path: Path) -> list[list[tuple[str, str]]]:
    """Each rollout's attempts as (status, worker id)."""
    store = SqliteStore(path)
    try:
        found = []
        for rollout in await store.query_rollouts():
            attempts = await store.list_attempts(rollout.rollout_id)
            found.append([(attempt.status, attempt.worker_id or "") for attempt in attempts])
        return found
    finally:
        await store.close()


def test_grpo_trains_through_ray_runner_actors(tmp_path: Path) -> None:
    assert not ray.is_initialized()
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    splits = make_splits(seed=0, sizes=(8, 4, 4))
    trainer = Trainer(
        algorithm=GRPO(group_size=2, batch_tasks=2, max_steps=1, max_tokens=8, val_every=1),
        engine=EngineConfig(model=model, device="cpu"),
        run_dir=tmp_path / "run",
        n_runners=2,
        runners=RayRunners(num_cpus=2),
        progress=False,
    )
    history = trainer.fit(calc_agent, splits["train"], splits["val"][:2])
    assert [m["step"] for m in history] == [0, 1]
    assert (history[1]["rollouts"], history[1]["rollouts_failed"]) == (4, 0)
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "config.json").is_file()
    attempts = asyncio.run(attempts_of(tmp_path / "run" / "store.sqlite"))
    assert len(attempts) == 8  # 2 tasks x 2, and 2 validation rollouts before the step and after it
    assert all(worker.startswith("ray-") for per_rollout in attempts for _, worker in per_rollout)
    assert not ray.is_initialized()  # the session started Ray and shut it down
    assert not ray_processes()


def test_a_runner_that_dies_mid_rollout_leaves_it_to_another(tmp_path: Path) -> None:
    with ScriptedOpenAIServer() as upstream:
        trainer = Trainer(
            algorithm=GRPO(),
            upstream=upstream.url,
            model="scripted",
            run_dir=tmp_path / "run",
            n_runners=2,
            runners=RayRunners(num_cpus=2),
            progress=False,
            rollout_config=RolloutConfig(
                timeout_seconds=120, unresponsive_seconds=3, max_attempts=2, retry_on=("unresponsive",)
            ),
        )
        report = trainer.dev(kills_its_runner_first_time, [{"task": 1}])
    assert [r.status for r in report.rollouts] == ["succeeded"]
    [[(first, dead), (second, alive)]] = asyncio.run(attempts_of(tmp_path / "run" / "store.sqlite"))
    assert (first, second) == ("unresponsive", "succeeded")
    assert dead != alive  # the retry ran on the other actor
    assert not ray.is_initialized()
    assert not ray_processes()


def test_a_ray_the_process_started_is_used_and_left_running(tmp_path: Path) -> None:
    # Ray started by the test process itself, with the path its actors import the agent from.
    path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
    runtime_env = {"env_vars": {"PYTHONPATH": path}}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
    try:
        with ScriptedOpenAIServer() as upstream:
            trainer = Trainer(
                algorithm=GRPO(),
                upstream=upstream.url,
                model="scripted",
                run_dir=tmp_path / "run",
                n_runners=1,
                runners=RayRunners(),
                progress=False,
            )
            report = trainer.dev(sleeper, [{"seconds": 0.01}])
        assert [r.status for r in report.rollouts] == ["succeeded"]
        assert ray.is_initialized()  # not the session's to shut down
    finally:
        ray.shutdown()
