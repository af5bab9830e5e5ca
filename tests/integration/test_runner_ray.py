"""Runners as Ray actors on a local Ray instance, sharing one SQLite store file."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulgor.runner.pool import PoolConfig
from fulgor.runner.ray_pool import RayRunnerPool
from fulgor.runner.worker import RunnerConfig
from fulgor.semconv import ATTR_MESSAGE_BODY, SPAN_MESSAGE
from fulgor.store import SqliteStore
from fulgor.types import Attempt, RolloutRequest

ray = pytest.importorskip("ray", reason="the ray extra is installed by make test")
pytestmark = pytest.mark.usefixtures("ray_offline")
ROOT = Path(__file__).resolve().parents[2]
# The checkout first (for the test agents), then whatever path this test run was given.
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def test_ray_pool_says_when_ray_is_not_initialised(tmp_path: Path) -> None:
    from fulgor.errors import ConfigError

    assert not ray.is_initialized()  # this test runs before the module's Ray instance starts
    pool = RayRunnerPool("tests.integration.sample_agents.slow_agent:sleeper", f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(ConfigError, match=r"ray\.init"):
        pool.start()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(
        "local",  # a new instance, whatever cluster this machine runs
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": PYTHONPATH}},
    )
    yield
    ray.shutdown()


def test_ray_actors_run_every_rollout_once(local_ray: None, tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"

    async def enqueue() -> list[str]:
        store = SqliteStore(path)
        created = await store.enqueue([RolloutRequest(input={"seconds": 0.05}) for _ in range(8)])
        await store.close()
        return [r.rollout_id for r in created]

    rollout_ids = asyncio.run(enqueue())
    config = PoolConfig(n_runners=2, runner=RunnerConfig(max_concurrency=2, claim_wait_seconds=0.5))
    pool = RayRunnerPool("tests.integration.sample_agents.slow_agent:sleeper", f"sqlite:///{path}", config)
    pool.start()

    async def outcome() -> tuple[list[str], list[list[Attempt]], list[list[str]]]:
        store = SqliteStore(path)
        done = await store.wait(rollout_ids, timeout_seconds=60)
        attempts = [await store.list_attempts(r) for r in rollout_ids]
        # Every run of the agent records one message naming its process; counted over all attempts.
        runs = [
            [span.attributes[ATTR_MESSAGE_BODY] for span in await store.query_spans(r, name=SPAN_MESSAGE)]
            for r in rollout_ids
        ]
        await store.close()
        return [r.status for r in done], attempts, runs

    statuses, attempts, runs = asyncio.run(outcome())
    completed = pool.stop()
    assert statuses == ["succeeded"] * 8
    assert completed == 8
    assert [len(a) for a in attempts] == [1] * 8
    assert {a[0].worker_id for a in attempts} <= set(pool.worker_ids)
    assert [len(messages) for messages in runs] == [1] * 8
    pids = {int(messages[0].split()[1]) for messages in runs}
    assert os.getpid() not in pids  # the agents ran in the actors, not in this process


def call_until_gone(actor: Any, seconds: float) -> None:
    """Call ``actor`` until it is gone (ray.kill is asynchronous: a call made right after it may
    still be served); returns only if it is still there after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ray.get(actor.stop.remote(), timeout=30)
        time.sleep(0.2)


def test_stop_kills_every_actor_even_when_one_has_died(local_ray: None, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    config = PoolConfig(n_runners=2, runner=RunnerConfig(claim_wait_seconds=0.2, heartbeat_seconds=0.2))
    pool = RayRunnerPool("tests.integration.sample_agents.slow_agent:sleeper", url, config)
    pool.start()

    async def heartbeating() -> set[str]:
        store = SqliteStore(tmp_path / "store.sqlite")
        for _ in range(300):
            workers = {w.worker_id for w in await store.list_workers()}
            if len(workers) == 2:
                break
            await asyncio.sleep(0.1)
        await store.close()
        return workers

    assert asyncio.run(heartbeating()) == set(pool.worker_ids)
    dead, healthy = pool._actors
    ray.kill(dead)
    pool.stop(timeout_seconds=10)
    with pytest.raises(ray.exceptions.RayActorError):
        call_until_gone(healthy, seconds=30)
