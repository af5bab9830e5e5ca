"""Store conformance for persistent backends: reopening, and several stores sharing one backend."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from storetools import PERSISTENT, FakeClock, MakeStore, counts, request, span

from fulgor.store.base import Store
from fulgor.types import PromptTemplate


@pytest.fixture(autouse=True)
def _persistent_only(backend: str) -> None:
    if backend not in PERSISTENT:
        pytest.skip(f"{backend} keeps nothing beyond the store object")


async def everything(store: Store) -> tuple[Any, ...]:
    rollouts = await store.query_rollouts()
    return (
        rollouts,
        [await store.list_attempts(r.rollout_id) for r in rollouts],
        [await store.query_spans(r.rollout_id) for r in rollouts],
        await store.list_workers(),
        await store.get_resources(),
        counts(await store.stats()),
    )


async def test_acknowledged_writes_survive_reopening(make_store: MakeStore, clock: FakeClock) -> None:
    store = await make_store(clock)
    await store.put_resources({"p": PromptTemplate(template="v1")}, "prompt")
    created = await store.enqueue([request({"n": n}, max_attempts=2, group_id="g") for n in range(4)])
    claimed = await store.claim("w1", limit=3)
    await store.add_spans(
        [span(c.rollout_id, c.attempt.attempt_id, attributes={"i": i}) for i, c in enumerate(claimed)]
    )
    await store.update_attempt(claimed[0].rollout_id, claimed[0].attempt.attempt_id, status="succeeded")
    await store.update_attempt(claimed[1].rollout_id, claimed[1].attempt.attempt_id, status="failed")
    await store.cancel([created[3].rollout_id])
    await store.heartbeat("w2", {"gpu": 1})
    before = await everything(store)
    await store.close()

    reopened = await make_store(clock)

    assert await everything(reopened) == before
    # The queue survives too: the requeued rollout is next, and sequence ids go on from where they were.
    (again,) = await reopened.claim("w3")
    assert (again.rollout_id, again.attempt.sequence_id) == (claimed[1].rollout_id, 2)
    (more,) = await reopened.add_spans([span(claimed[2].rollout_id, claimed[2].attempt.attempt_id)])
    assert more.sequence_id == 2
    assert (await reopened.put_resources({"p": PromptTemplate(template="v2")})).version == 2


async def test_watchdog_deadlines_survive_reopening(make_store: MakeStore, clock: FakeClock) -> None:
    store = await make_store(clock)
    (rollout,) = await store.enqueue([request(timeout_seconds=30)])
    await store.claim("w1")
    await store.close()
    clock.advance(30)

    reopened = await make_store(clock)

    assert [a.status for a in await reopened.list_attempts(rollout.rollout_id)] == ["timeout"]


async def test_two_stores_on_one_backend_claim_each_rollout_once(make_store: MakeStore) -> None:
    first, second = await make_store(), await make_store()
    created = await first.enqueue([request({"n": n}) for n in range(20)])

    async def drain(store: Store, worker: str) -> list[str]:
        taken: list[str] = []
        while claimed := await store.claim(worker, limit=2):
            taken += [c.rollout_id for c in claimed]
            await asyncio.sleep(0)
        return taken

    one, two = await asyncio.gather(drain(first, "w1"), drain(second, "w2"))

    assert not set(one) & set(two)
    assert sorted(one + two) == sorted(r.rollout_id for r in created)
    assert one == sorted(one, key=[r.rollout_id for r in created].index)
    attempts = [await second.list_attempts(r.rollout_id) for r in created]
    assert all(len(a) == 1 for a in attempts)


async def test_waiting_claim_sees_an_enqueue_through_another_store(make_store: MakeStore) -> None:
    first, second = await make_store(), await make_store()

    async def enqueue_later() -> str:
        await asyncio.sleep(0.1)
        (rollout,) = await first.enqueue([request()])
        return rollout.rollout_id

    started = time.monotonic()
    claimed, rollout_id = await asyncio.gather(second.claim("w1", wait_seconds=10), enqueue_later())

    assert [c.rollout_id for c in claimed] == [rollout_id]
    assert time.monotonic() - started < 3.0


async def test_wait_sees_an_end_through_another_store(make_store: MakeStore) -> None:
    first, second = await make_store(), await make_store()
    (rollout,) = await first.enqueue([request()])
    (claimed,) = await first.claim("w1")

    async def finish_later() -> None:
        await asyncio.sleep(0.1)
        await first.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="succeeded")

    started = time.monotonic()
    done, _ = await asyncio.gather(second.wait([rollout.rollout_id], timeout_seconds=10), finish_later())

    assert [(r.rollout_id, r.status) for r in done] == [(rollout.rollout_id, "succeeded")]
    assert time.monotonic() - started < 3.0
