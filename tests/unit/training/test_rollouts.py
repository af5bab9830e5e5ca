"""run_rollouts: a collection that is cancelled or fails leaves none of its rollouts queued."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fulgor.errors import FulgorError
from fulgor.store import MemoryStore
from fulgor.training.rollouts import run_rollouts
from fulgor.types import Rollout, RolloutRequest


class Runners:
    """A runner group that is fine until told otherwise."""

    description = "no runners"

    def __init__(self) -> None:
        self.failure: Exception | None = None

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def stop(self) -> None:
        pass


def requests(count: int) -> list[RolloutRequest]:
    return [RolloutRequest(input={"task": i}, group_id="g") for i in range(count)]


class WatchedStore(MemoryStore):
    """A MemoryStore that says when rollouts were enqueued."""

    def __init__(self) -> None:
        super().__init__()
        self.enqueued = asyncio.Event()

    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        enqueued = await super().enqueue(requests)
        self.enqueued.set()
        return enqueued


class UnreachableStore(WatchedStore):
    """A store that cannot be reached any more when the collection ends."""

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        raise ConnectionError("store unreachable")


async def test_a_cancelled_collection_cancels_every_rollout_it_enqueued() -> None:
    store = WatchedStore()
    collecting = asyncio.create_task(run_rollouts(store, requests(3), Runners()))
    await store.enqueued.wait()
    claimed = await store.claim("worker-1")  # one running, two queued

    collecting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await collecting

    assert [r.status for r in await store.query_rollouts()] == ["cancelled"] * 3
    assert await store.claim("worker-2") == []  # nothing left for the next runners
    [attempt] = await store.list_attempts(claimed[0].rollout_id)
    assert (attempt.status, attempt.error) == ("failed", "cancelled")


async def test_a_rollout_that_ended_meanwhile_stays_as_it_ended_and_the_others_are_cancelled() -> None:
    store = WatchedStore()
    collecting = asyncio.create_task(run_rollouts(store, requests(3), Runners()))
    await store.enqueued.wait()
    [done] = await store.claim("worker-1")
    # It ends while the collection still waits for the others: the store then refuses to cancel
    # a list that holds it.
    await store.update_attempt(done.rollout_id, done.attempt.attempt_id, status="succeeded")

    collecting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await collecting

    statuses = {r.rollout_id: r.status for r in await store.query_rollouts()}
    assert statuses.pop(done.rollout_id) == "succeeded"
    assert list(statuses.values()) == ["cancelled", "cancelled"]


async def test_runners_that_died_fail_the_collection_and_its_rollouts_are_cancelled() -> None:
    store = MemoryStore()
    runners = Runners()
    runners.failure = FulgorError("the runner processes exited (code 1)")

    with pytest.raises(FulgorError, match="runner processes exited"):
        await run_rollouts(store, requests(2), runners)

    assert [r.status for r in await store.query_rollouts()] == ["cancelled"] * 2


async def test_a_store_that_cannot_cancel_does_not_hide_why_the_collection_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = UnreachableStore()
    collecting = asyncio.create_task(run_rollouts(store, requests(1), Runners()))
    await store.enqueued.wait()

    collecting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await collecting
    assert "could not cancel 1 unfinished rollouts" in caplog.text
