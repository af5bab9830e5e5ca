"""The Collector: a step's rollouts collecting in the background, timed, cancelled on leaving."""

from __future__ import annotations

import asyncio

import pytest

from fulgor.training.collector import Collector
from fulgor.types import Rollout


def rollout(step: int) -> Rollout:
    return Rollout(rollout_id=f"ro-{step}", input={"step": step}, status="succeeded", enqueue_time=0.0)


async def test_a_step_collected_ahead_runs_while_the_caller_works_and_is_timed() -> None:
    started: list[tuple[int, str]] = []
    release = asyncio.Event()

    async def collect(step: int, resources: str) -> list[Rollout]:
        started.append((step, resources))
        await release.wait()
        await asyncio.sleep(0.05)
        return [rollout(step)]

    async with Collector(collect) as collector:
        release.set()
        rollouts, timer = await collector.take(1, "v0")  # none ahead: collected now
        assert [r.rollout_id for r in rollouts] == ["ro-1"]
        assert timer.seconds["collect_rollouts"] >= 0.05

        release.clear()
        collector.start(2, "v1")
        await asyncio.sleep(0.01)
        assert started == [(1, "v0"), (2, "v1")]  # step 2 runs while the caller is elsewhere
        with pytest.raises(RuntimeError, match="step 2's rollouts are still being collected"):
            collector.start(3, "v1")
        with pytest.raises(RuntimeError, match="step 3's rollouts were asked for"):
            await collector.take(3, "v1")
        release.set()
        rollouts, timer = await collector.take(2, "ignored: already started with v1")
        assert [r.rollout_id for r in rollouts] == ["ro-2"]
        assert timer.seconds["collect_rollouts"] >= 0.05


async def test_leaving_cancels_a_collection_still_running() -> None:
    cancelled = asyncio.Event()

    async def collect(step: int, resources: None) -> list[Rollout]:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return []

    async with Collector(collect) as collector:
        collector.start(1, None)
        await asyncio.sleep(0.01)
    assert cancelled.is_set()


async def test_a_failed_collection_fails_the_step_that_takes_it() -> None:
    async def collect(step: int, resources: None) -> list[Rollout]:
        raise ConnectionError("store unreachable")

    async with Collector(collect) as collector:
        with pytest.raises(ConnectionError, match="store unreachable"):
            await collector.take(1, None)
        collector.start(2, None)  # the failed collection no longer holds the slot
        with pytest.raises(ConnectionError):
            await collector.take(2, None)
