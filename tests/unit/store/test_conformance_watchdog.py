"""Store conformance: the watchdog (timeout_seconds, unresponsive_seconds), on every backend."""

from __future__ import annotations

import time

import pytest
from storetools import FakeClock, MakeStore, check_a_new_deadline_wakes_a_waiter, request, span

from fulgor.store.base import Store


async def test_timeout_ends_the_attempt_after_timeout_seconds(store: Store, clock: FakeClock) -> None:
    (rollout,) = await store.enqueue([request(timeout_seconds=60)])
    (claimed,) = await store.claim("w1")
    await store.add_spans([span(rollout.rollout_id, claimed.attempt.attempt_id)])

    clock.advance(59.5)
    assert (await store.get_rollout(rollout.rollout_id)).status == "running"
    clock.advance(0.5)

    (attempt,) = await store.list_attempts(rollout.rollout_id)
    assert attempt.status == "timeout"
    assert attempt.end_time is not None
    assert attempt.error
    assert (await store.get_rollout(rollout.rollout_id)).status == "failed"


async def test_activity_does_not_extend_the_timeout(store: Store, clock: FakeClock) -> None:
    (rollout,) = await store.enqueue([request(timeout_seconds=10, max_attempts=2)])
    (claimed,) = await store.claim("w1")
    for _ in range(4):
        clock.advance(3)
        await store.add_spans([span(rollout.rollout_id, claimed.attempt.attempt_id)])
        await store.heartbeat("w1")

    assert (await store.get_rollout(rollout.rollout_id)).status == "requeuing"
    assert [a.status for a in await store.list_attempts(rollout.rollout_id)] == ["timeout"]


async def test_unresponsive_after_silence(store: Store, clock: FakeClock) -> None:
    (rollout,) = await store.enqueue([request(unresponsive_seconds=30)])
    await store.claim("w1")

    clock.advance(29)
    assert (await store.list_attempts(rollout.rollout_id))[0].status == "preparing"
    clock.advance(1)

    (attempt,) = await store.list_attempts(rollout.rollout_id)
    assert attempt.status == "unresponsive"
    assert (await store.get_rollout(rollout.rollout_id)).status == "failed"


@pytest.mark.parametrize("activity", ["span", "heartbeat", "update"])
async def test_activity_keeps_an_attempt_alive(store: Store, clock: FakeClock, activity: str) -> None:
    (rollout,) = await store.enqueue([request(unresponsive_seconds=10)])
    (claimed,) = await store.claim("w1")
    attempt_id = claimed.attempt.attempt_id
    for _ in range(5):
        clock.advance(8)
        if activity == "span":
            await store.add_spans([span(rollout.rollout_id, attempt_id)])
        elif activity == "heartbeat":
            await store.heartbeat("w1")
        else:
            await store.update_attempt(rollout.rollout_id, attempt_id, metadata={"tick": True})
        (attempt,) = await store.list_attempts(rollout.rollout_id)
        assert attempt.is_live, f"{activity} every 8s must keep a 10s unresponsive watchdog quiet"
        assert attempt.last_active_time == clock.now

    clock.advance(10)
    assert (await store.list_attempts(rollout.rollout_id))[0].status == "unresponsive"


async def test_heartbeat_of_another_worker_keeps_nothing_alive(store: Store, clock: FakeClock) -> None:
    (rollout,) = await store.enqueue([request(unresponsive_seconds=10)])
    await store.claim("w1")
    clock.advance(6)
    await store.heartbeat("w2")
    clock.advance(6)

    assert (await store.list_attempts(rollout.rollout_id))[0].status == "unresponsive"


async def test_heartbeat_after_the_deadline_comes_too_late(store: Store, clock: FakeClock) -> None:
    (rollout,) = await store.enqueue([request(unresponsive_seconds=10, max_attempts=2)])
    await store.claim("w1")
    clock.advance(11)

    await store.heartbeat("w1")

    assert [a.status for a in await store.list_attempts(rollout.rollout_id)] == ["unresponsive"]
    assert (await store.get_rollout(rollout.rollout_id)).status == "requeuing"


async def test_watchdog_requeues_behind_earlier_rollouts(store: Store, clock: FakeClock) -> None:
    (slow,) = await store.enqueue([request({"n": 0}, timeout_seconds=5, max_attempts=2)])
    await store.claim("w1")
    waiting = await store.enqueue([request({"n": 1})])
    clock.advance(5)
    later = await store.enqueue([request({"n": 2})])

    order = [c.rollout_id for c in await store.claim("w2", limit=5)]

    assert order == [waiting[0].rollout_id, slow.rollout_id, later[0].rollout_id]


@pytest.mark.parametrize("outcome", ["timeout", "unresponsive"])
async def test_watchdog_outcome_follows_retry_on(store: Store, clock: FakeClock, outcome: str) -> None:
    config = {"timeout_seconds": 5} if outcome == "timeout" else {"unresponsive_seconds": 5}
    retried, not_retried = await store.enqueue(
        [
            request({"n": 0}, max_attempts=2, **config),
            request({"n": 1}, max_attempts=2, retry_on=("failed",), **config),
        ]
    )
    await store.claim("w1", limit=2)
    clock.advance(5)

    assert (await store.get_rollout(retried.rollout_id)).status == "requeuing"
    assert (await store.get_rollout(not_retried.rollout_id)).status == "failed"
    assert [a.status for a in await store.list_attempts(not_retried.rollout_id)] == [outcome]


async def test_the_deadline_that_passed_first_decides(store: Store, clock: FakeClock) -> None:
    # Silent since t=0: unresponsive at t=10 already, long before the timeout at t=100. A store that
    # applies the watchdog lazily must still report what happened first.
    (rollout,) = await store.enqueue([request(timeout_seconds=100, unresponsive_seconds=10)])
    await store.claim("w1")

    clock.advance(200)

    assert [a.status for a in await store.list_attempts(rollout.rollout_id)] == ["unresponsive"]


async def test_each_retry_gets_its_own_deadline(store: Store, clock: FakeClock) -> None:
    (rollout,) = await store.enqueue([request(timeout_seconds=10, max_attempts=2)])
    await store.claim("w1")
    clock.advance(10)
    (again,) = await store.claim("w2")
    clock.advance(9)

    assert [a.status for a in await store.list_attempts(rollout.rollout_id)] == ["timeout", "preparing"]
    clock.advance(1)
    assert [a.status for a in await store.list_attempts(rollout.rollout_id)] == ["timeout", "timeout"]
    assert (await store.get_rollout(rollout.rollout_id)).status == "failed"
    assert again.attempt.sequence_id == 2


async def test_stats_and_queries_see_deadlines_applied(store: Store, clock: FakeClock) -> None:
    await store.enqueue([request(timeout_seconds=1, max_attempts=2), request(timeout_seconds=1)])
    await store.claim("w1", limit=2)
    clock.advance(1)

    stats = await store.stats()
    assert {k: v for k, v in stats.rollouts.items() if v} == {"requeuing": 1, "failed": 1}
    assert {k: v for k, v in stats.attempts.items() if v} == {"timeout": 2}
    assert len(await store.query_rollouts(status="requeuing")) == 1


# -- real time: waiting calls wake at the next deadline -----------------------------------------------


async def test_claim_wait_wakes_when_a_timeout_requeues(make_store: MakeStore) -> None:
    store = await make_store()
    (rollout,) = await store.enqueue([request(timeout_seconds=0.3, max_attempts=2)])
    await store.claim("w1")
    started = time.monotonic()

    again = await store.claim("w2", wait_seconds=10)

    assert [(c.rollout_id, c.attempt.sequence_id) for c in again] == [(rollout.rollout_id, 2)]
    assert time.monotonic() - started < 3.0


async def test_wait_wakes_when_unresponsive_fails_the_rollout(make_store: MakeStore) -> None:
    store = await make_store()
    (rollout,) = await store.enqueue([request(unresponsive_seconds=0.3)])
    await store.claim("w1")
    started = time.monotonic()

    done = await store.wait([rollout.rollout_id], timeout_seconds=10)

    assert [(r.rollout_id, r.status) for r in done] == [(rollout.rollout_id, "failed")]
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("waiting", ["claim", "wait"])
async def test_waiting_calls_wake_at_a_deadline_that_appeared_while_they_slept(
    make_store: MakeStore, waiting: str
) -> None:
    await check_a_new_deadline_wakes_a_waiter(await make_store(), waiting)


async def test_heartbeat_with_attempt_ids_refreshes_only_those(store: Store, clock: FakeClock) -> None:
    # A claim retried on another server took a second rollout for w1; w1 runs (and names) only the
    # attempt it heard of, so the other one goes unresponsive and is retried.
    orphan, kept = await store.enqueue(
        [request({"n": i}, unresponsive_seconds=10, max_attempts=2) for i in (0, 1)]
    )
    (other,) = await store.enqueue([request({"n": 2}, unresponsive_seconds=10)])
    (lost,) = await store.claim("w1")
    (heard,) = await store.claim("w1")
    (elsewhere,) = await store.claim("w2")
    for _ in range(3):
        clock.advance(6)
        named = [heard.attempt.attempt_id, elsewhere.attempt.attempt_id, "at-unknown"]
        await store.heartbeat("w1", {"active": 1}, attempt_ids=named)

    assert lost.rollout_id == orphan.rollout_id
    assert [a.status for a in await store.list_attempts(orphan.rollout_id)] == ["unresponsive"]
    assert (await store.get_rollout(orphan.rollout_id)).status == "requeuing"
    assert [a.status for a in await store.list_attempts(kept.rollout_id)] == ["preparing"]
    # Another worker's attempt is not this worker's to keep alive, even when named.
    assert [a.status for a in await store.list_attempts(other.rollout_id)] == ["unresponsive"]
    assert (await store.list_workers())[0].stats == {"active": 1}

    (retry,) = await store.claim("w3", limit=5)
    assert (retry.rollout_id, retry.attempt.sequence_id) == (orphan.rollout_id, 2)
    clock.advance(1)
    await store.heartbeat("w3", attempt_ids=[])
    assert (await store.list_attempts(orphan.rollout_id))[1].last_active_time == retry.attempt.start_time
    await store.heartbeat("w3")
    assert (await store.list_attempts(orphan.rollout_id))[1].last_active_time == clock.now
