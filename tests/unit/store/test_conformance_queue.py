"""Store conformance: the queue (enqueue, claim, start_rollout, start_attempt), on every backend."""

from __future__ import annotations

import asyncio
import time

import pytest
from storetools import START_TIME, FakeClock, MakeStore, request, span

from fulgor.errors import InvalidTransitionError
from fulgor.store.base import Store


async def test_enqueue_creates_queuing_rollouts_in_order(store: Store) -> None:
    created = await store.enqueue(
        [request({"n": 1}, group_id="g", mode="val", metadata={"k": "v"}), request({"n": 2})]
    )

    assert [r.input for r in created] == [{"n": 1}, {"n": 2}]
    assert len({r.rollout_id for r in created}) == 2
    first = created[0]
    assert (first.status, first.mode, first.group_id, first.metadata) == ("queuing", "val", "g", {"k": "v"})
    assert (first.attempt_count, first.enqueue_time, first.start_time, first.end_time) == (
        0,
        START_TIME,
        None,
        None,
    )
    assert await store.get_rollout(first.rollout_id) == first
    assert await store.query_rollouts() == created


async def test_enqueue_nothing_returns_nothing(store: Store) -> None:
    assert await store.enqueue([]) == []
    assert await store.query_rollouts() == []


async def test_claim_is_fifo_and_starts_a_preparing_attempt(store: Store, clock: FakeClock) -> None:
    created = await store.enqueue([request({"n": n}) for n in range(3)])
    clock.advance(5)

    claimed = [(await store.claim("w1"))[0] for _ in range(3)]

    assert [c.rollout_id for c in claimed] == [r.rollout_id for r in created]
    first = claimed[0]
    assert (first.status, first.attempt_count, first.start_time) == ("preparing", 1, START_TIME + 5)
    attempt = first.attempt
    assert (attempt.rollout_id, attempt.sequence_id, attempt.worker_id) == (first.rollout_id, 1, "w1")
    assert (attempt.status, attempt.start_time, attempt.end_time) == ("preparing", START_TIME + 5, None)
    assert await store.list_attempts(first.rollout_id) == [attempt]
    assert (await store.get_rollout(first.rollout_id)).status == "preparing"
    assert await store.claim("w1") == []


async def test_claim_takes_up_to_limit_oldest_first(store: Store) -> None:
    created = await store.enqueue([request({"n": n}) for n in range(5)])

    first = await store.claim("w1", limit=3)
    second = await store.claim("w2", limit=3)

    assert [c.rollout_id for c in first] == [r.rollout_id for r in created[:3]]
    assert [c.rollout_id for c in second] == [r.rollout_id for r in created[3:]]
    assert {c.attempt.worker_id for c in second} == {"w2"}


async def test_requeued_rollout_goes_to_the_back_of_the_queue(store: Store) -> None:
    (first,) = await store.enqueue([request({"n": 0}, max_attempts=2)])
    (claimed,) = await store.claim("w1")
    later = await store.enqueue([request({"n": 1}), request({"n": 2})])

    await store.update_attempt(first.rollout_id, claimed.attempt.attempt_id, status="failed")
    assert (await store.get_rollout(first.rollout_id)).status == "requeuing"
    after = await store.enqueue([request({"n": 3})])

    order = [c.rollout_id for c in await store.claim("w1", limit=10)]
    assert order == [later[0].rollout_id, later[1].rollout_id, first.rollout_id, after[0].rollout_id]
    again = next(c for c in await store.list_attempts(first.rollout_id) if c.sequence_id == 2)
    assert again.status == "preparing"


async def test_claim_wait_returns_as_soon_as_something_is_enqueued(make_store: MakeStore) -> None:
    store = await make_store()

    async def enqueue_later() -> str:
        await asyncio.sleep(0.1)
        (rollout,) = await store.enqueue([request()])
        return rollout.rollout_id

    started = time.monotonic()
    claimed, rollout_id = await asyncio.gather(store.claim("w1", wait_seconds=10), enqueue_later())
    elapsed = time.monotonic() - started

    assert [c.rollout_id for c in claimed] == [rollout_id]
    assert elapsed < 2.0, f"claim woke {elapsed:.2f}s after start; it must wake on the enqueue, not the wait"


async def test_claim_wait_wakes_on_a_requeue(make_store: MakeStore) -> None:
    store = await make_store()
    (rollout,) = await store.enqueue([request(max_attempts=2)])
    (claimed,) = await store.claim("w1")

    async def fail_later() -> None:
        await asyncio.sleep(0.1)
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="failed")

    started = time.monotonic()
    again, _ = await asyncio.gather(store.claim("w2", wait_seconds=10), fail_later())

    assert time.monotonic() - started < 2.0
    assert [(c.rollout_id, c.attempt.sequence_id) for c in again] == [(rollout.rollout_id, 2)]


async def test_claim_wait_returns_nothing_after_the_wait(make_store: MakeStore) -> None:
    store = await make_store()
    started = time.monotonic()

    assert await store.claim("w1", wait_seconds=0.3) == []
    assert 0.25 <= time.monotonic() - started < 3.0


async def test_concurrent_waiting_claims_each_get_a_different_rollout(make_store: MakeStore) -> None:
    store = await make_store()
    waiting = [asyncio.ensure_future(store.claim(f"w{i}", wait_seconds=5)) for i in range(3)]
    await asyncio.sleep(0.05)
    created = await store.enqueue([request({"n": n}) for n in range(3)])

    results = await asyncio.wait_for(asyncio.gather(*waiting), timeout=5)

    assert all(len(result) == 1 for result in results)
    assert sorted(r[0].rollout_id for r in results) == sorted(r.rollout_id for r in created)


async def test_start_rollout_skips_the_queue(store: Store) -> None:
    queued = await store.enqueue([request({"n": 0})])

    started = await store.start_rollout(request({"n": 1}, group_id="dev"), "w9")

    assert (started.status, started.attempt_count, started.group_id) == ("preparing", 1, "dev")
    assert (started.attempt.status, started.attempt.worker_id, started.attempt.sequence_id) == (
        "preparing",
        "w9",
        1,
    )
    assert [c.rollout_id for c in await store.claim("w1", limit=5)] == [queued[0].rollout_id]
    assert await store.list_attempts(started.rollout_id) == [started.attempt]


async def test_start_attempt_takes_a_queued_rollout_off_the_queue(store: Store) -> None:
    first, second = await store.enqueue([request({"n": 0}), request({"n": 1})])

    started = await store.start_attempt(second.rollout_id, "w2")

    assert (started.rollout_id, started.status, started.attempt.status) == (
        second.rollout_id,
        "preparing",
        "preparing",
    )
    assert [c.rollout_id for c in await store.claim("w1", limit=5)] == [first.rollout_id]


async def test_start_attempt_on_a_requeuing_rollout(store: Store) -> None:
    (rollout,) = await store.enqueue([request(max_attempts=3)])
    (claimed,) = await store.claim("w1")
    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="timeout")

    started = await store.start_attempt(rollout.rollout_id, "w2")

    assert (started.attempt_count, started.attempt.sequence_id, started.attempt.worker_id) == (2, 2, "w2")
    assert await store.claim("w1") == []


@pytest.mark.parametrize("state", ["preparing", "running", "succeeded", "failed", "cancelled"])
async def test_start_attempt_needs_a_queued_rollout(store: Store, state: str) -> None:
    (rollout,) = await store.enqueue([request()])
    if state == "cancelled":
        await store.cancel([rollout.rollout_id])
    else:
        (claimed,) = await store.claim("w1")
        if state == "running":
            await store.add_spans([span(rollout.rollout_id, claimed.attempt.attempt_id)])
        elif state != "preparing":
            await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status=state)
    before = await store.list_attempts(rollout.rollout_id)

    with pytest.raises(InvalidTransitionError) as raised:
        await store.start_attempt(rollout.rollout_id, "w2")

    assert state in str(raised.value)
    assert (await store.get_rollout(rollout.rollout_id)).status == state
    assert await store.list_attempts(rollout.rollout_id) == before


async def test_rollout_records_latest_resources_when_its_first_attempt_starts(store: Store) -> None:
    from fulgor.types import LLM

    (_, floating) = await store.enqueue([request(resources_id="fixed"), request()])
    await store.put_resources({"llm": LLM(endpoint="http://a/v1", model="m")})
    second = await store.put_resources({"llm": LLM(endpoint="http://b/v1", model="m")})

    claimed = await store.claim("w1", limit=2)

    assert [c.resources_id for c in claimed] == ["fixed", second.resources_id]
    assert (await store.get_rollout(floating.rollout_id)).resources_id == second.resources_id
