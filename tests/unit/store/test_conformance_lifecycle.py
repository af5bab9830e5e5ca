"""Store conformance: the attempt and rollout state machines, retries and cancel, on every backend."""

from __future__ import annotations

from typing import Any

import pytest
from storetools import START_TIME, FakeClock, counts, request, span

from fulgor.errors import InvalidTransitionError, ValidationError
from fulgor.store.base import Store
from fulgor.types import AttemptedRollout

END_STATUSES = ["succeeded", "failed", "timeout", "unresponsive"]
ROLLOUT_AFTER_ONLY_ATTEMPT = {
    "succeeded": "succeeded",
    "failed": "failed",
    "timeout": "failed",
    "unresponsive": "failed",
}


async def claim_new(store: Store, **config: Any) -> AttemptedRollout:
    await store.enqueue([request(**config)])
    (claimed,) = await store.claim("w1")
    return claimed


@pytest.mark.parametrize("end", END_STATUSES)
async def test_preparing_attempt_may_end_directly(store: Store, clock: FakeClock, end: str) -> None:
    claimed = await claim_new(store)
    clock.advance(3)

    attempt = await store.update_attempt(
        claimed.rollout_id, claimed.attempt.attempt_id, status=end, error="why"
    )

    assert (attempt.status, attempt.end_time, attempt.error) == (end, START_TIME + 3, "why")
    rollout = await store.get_rollout(claimed.rollout_id)
    assert (rollout.status, rollout.end_time) == (ROLLOUT_AFTER_ONLY_ATTEMPT[end], START_TIME + 3)
    assert await store.list_attempts(claimed.rollout_id) == [attempt]


@pytest.mark.parametrize("end", END_STATUSES)
async def test_running_attempt_may_end(store: Store, end: str) -> None:
    claimed = await claim_new(store)
    running = await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="running")
    assert running.status == "running"
    assert (await store.get_rollout(claimed.rollout_id)).status == "running"

    ended = await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status=end)

    assert ended.status == end
    assert (await store.get_rollout(claimed.rollout_id)).status == ROLLOUT_AFTER_ONLY_ATTEMPT[end]


async def test_running_attempt_cannot_go_back_to_preparing(store: Store) -> None:
    claimed = await claim_new(store)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="running")

    with pytest.raises(InvalidTransitionError) as raised:
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="preparing")

    assert (raised.value.from_status, raised.value.to_status) == ("running", "preparing")
    assert "'running'" in str(raised.value)
    assert "'preparing'" in str(raised.value)
    assert (await store.list_attempts(claimed.rollout_id))[0].status == "running"


@pytest.mark.parametrize("end", END_STATUSES)
@pytest.mark.parametrize("after", ["preparing", "running", *END_STATUSES])
async def test_ended_attempt_is_final(store: Store, clock: FakeClock, end: str, after: str) -> None:
    claimed = await claim_new(store)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status=end, error="first")
    before_attempts = await store.list_attempts(claimed.rollout_id)
    before_rollout = await store.get_rollout(claimed.rollout_id)
    clock.advance(1)

    with pytest.raises(InvalidTransitionError) as raised:
        await store.update_attempt(
            claimed.rollout_id, claimed.attempt.attempt_id, status=after, error="second", metadata={"x": 1}
        )

    assert (raised.value.from_status, raised.value.to_status) == (end, after)
    assert f"'{end}'" in str(raised.value)
    assert f"'{after}'" in str(raised.value)
    assert await store.list_attempts(claimed.rollout_id) == before_attempts
    assert await store.get_rollout(claimed.rollout_id) == before_rollout


async def test_update_without_status_changes_error_and_metadata_only(store: Store, clock: FakeClock) -> None:
    claimed = await claim_new(store)
    clock.advance(2)

    updated = await store.update_attempt(
        claimed.rollout_id, claimed.attempt.attempt_id, error="soft", metadata={"step": 1}
    )
    updated = await store.update_attempt(
        claimed.rollout_id, claimed.attempt.attempt_id, metadata={"other": 2}
    )

    assert (updated.status, updated.error, updated.last_active_time) == ("preparing", "soft", START_TIME + 2)
    assert updated.metadata["other"] == 2
    assert (await store.list_attempts(claimed.rollout_id)) == [updated]


async def test_a_nul_in_an_error_is_replaced_not_refused(store: Store) -> None:
    # The error is free text from whatever failed: losing the report would leave the attempt live.
    claimed = await claim_new(store)

    ended = await store.update_attempt(
        claimed.rollout_id, claimed.attempt.attempt_id, status="failed", error="bad\x00byte"
    )

    assert ended.error == "bad\ufffdbyte"
    assert (await store.list_attempts(claimed.rollout_id))[0].error == "bad\ufffdbyte"
    assert (await store.get_rollout(claimed.rollout_id)).status == "failed"


async def test_attempt_metadata_comes_back_as_json_gives_it(store: Store) -> None:
    claimed = await claim_new(store)

    updated = await store.update_attempt(
        claimed.rollout_id, claimed.attempt.attempt_id, metadata={"pair": (1, 2), "nested": {"t": ("a",)}}
    )

    expected = {"pair": [1, 2], "nested": {"t": ["a"]}}
    assert updated.metadata == expected
    assert (await store.list_attempts(claimed.rollout_id))[0].metadata == expected


@pytest.mark.parametrize("outcome", ["failed", "timeout", "unresponsive"])
async def test_retry_requeues_until_max_attempts(store: Store, outcome: str) -> None:
    (rollout,) = await store.enqueue([request(max_attempts=3)])
    for number in (1, 2, 3):
        (claimed,) = await store.claim("w1")
        assert (claimed.rollout_id, claimed.attempt.sequence_id, claimed.attempt_count) == (
            rollout.rollout_id,
            number,
            number,
        )
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status=outcome)
        now = await store.get_rollout(rollout.rollout_id)
        assert now.status == ("requeuing" if number < 3 else "failed")
        assert (now.end_time is None) == (number < 3)

    assert await store.claim("w1") == []
    attempts = await store.list_attempts(rollout.rollout_id)
    assert [(a.sequence_id, a.status) for a in attempts] == [(1, outcome), (2, outcome), (3, outcome)]
    assert len({a.attempt_id for a in attempts}) == 3


@pytest.mark.parametrize("outcome", ["failed", "timeout", "unresponsive"])
async def test_outcome_not_in_retry_on_fails_the_rollout(store: Store, outcome: str) -> None:
    others = tuple(s for s in ("failed", "timeout", "unresponsive") if s != outcome)
    claimed = await claim_new(store, max_attempts=5, retry_on=others)

    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status=outcome)

    assert (await store.get_rollout(claimed.rollout_id)).status == "failed"
    assert await store.claim("w1") == []


async def test_success_after_a_retry_succeeds_the_rollout(store: Store) -> None:
    claimed = await claim_new(store, max_attempts=2)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="failed")
    (again,) = await store.claim("w2")
    await store.update_attempt(claimed.rollout_id, again.attempt.attempt_id, status="running")

    await store.update_attempt(claimed.rollout_id, again.attempt.attempt_id, status="succeeded")

    rollout = await store.get_rollout(claimed.rollout_id)
    assert (rollout.status, rollout.attempt_count) == ("succeeded", 2)
    assert [a.status for a in await store.list_attempts(claimed.rollout_id)] == ["failed", "succeeded"]


async def test_an_old_attempt_cannot_end_the_rollout_again(store: Store) -> None:
    claimed = await claim_new(store, max_attempts=2)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="timeout")
    await store.claim("w2")

    with pytest.raises(InvalidTransitionError):
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")

    assert (await store.get_rollout(claimed.rollout_id)).status == "preparing"
    assert [a.status for a in await store.list_attempts(claimed.rollout_id)] == ["timeout", "preparing"]


# -- cancel -----------------------------------------------------------------------------------------


async def test_cancel_queued_rollout_takes_it_off_the_queue(store: Store, clock: FakeClock) -> None:
    first, second = await store.enqueue([request({"n": 0}), request({"n": 1})])
    clock.advance(4)

    (cancelled,) = await store.cancel([first.rollout_id])

    assert (cancelled.status, cancelled.end_time) == ("cancelled", START_TIME + 4)
    assert await store.get_rollout(first.rollout_id) == cancelled
    assert [c.rollout_id for c in await store.claim("w1", limit=5)] == [second.rollout_id]


@pytest.mark.parametrize("live", ["preparing", "running"])
async def test_cancel_running_rollout_fails_its_live_attempt(store: Store, live: str) -> None:
    claimed = await claim_new(store, max_attempts=3)
    if live == "running":
        await store.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id)])

    (cancelled,) = await store.cancel([claimed.rollout_id])

    assert cancelled.status == "cancelled"
    (attempt,) = await store.list_attempts(claimed.rollout_id)
    assert (attempt.status, attempt.error) == ("failed", "cancelled")
    assert attempt.end_time is not None
    assert await store.claim("w1") == [], "a cancelled rollout must not be retried"
    with pytest.raises(InvalidTransitionError):
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    assert (await store.get_rollout(claimed.rollout_id)).status == "cancelled"


async def test_cancel_requeuing_rollout(store: Store) -> None:
    claimed = await claim_new(store, max_attempts=2)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="failed")

    (cancelled,) = await store.cancel([claimed.rollout_id])

    assert cancelled.status == "cancelled"
    assert await store.claim("w1") == []
    assert [a.status for a in await store.list_attempts(claimed.rollout_id)] == ["failed"]


async def test_cancel_already_cancelled_is_left_as_it_is(store: Store, clock: FakeClock) -> None:
    (rollout,) = await store.enqueue([request()])
    (first,) = await store.cancel([rollout.rollout_id])
    clock.advance(10)

    (second,) = await store.cancel([rollout.rollout_id])

    assert second == first
    assert (await store.get_rollout(rollout.rollout_id)).end_time == START_TIME


@pytest.mark.parametrize("end", ["succeeded", "failed"])
async def test_cancel_of_an_ended_rollout_cancels_nothing(store: Store, end: str) -> None:
    claimed = await claim_new(store)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status=end)
    queued = await store.enqueue([request({"n": 0})])
    running = await store.start_rollout(request({"n": 2}), "w2")
    before = counts(await store.stats())

    with pytest.raises(InvalidTransitionError) as raised:
        await store.cancel([queued[0].rollout_id, claimed.rollout_id, running.rollout_id])

    assert (raised.value.from_status, raised.value.to_status) == (end, "cancelled")
    assert counts(await store.stats()) == before
    assert (await store.get_rollout(queued[0].rollout_id)).status == "queuing"
    assert (await store.get_rollout(running.rollout_id)).status == "preparing"
    assert (await store.get_rollout(claimed.rollout_id)).status == end


async def test_cancel_returns_rollouts_in_the_order_asked(store: Store) -> None:
    created = await store.enqueue([request({"n": n}) for n in range(3)])
    ids = [created[2].rollout_id, created[0].rollout_id]

    cancelled = await store.cancel(ids)

    assert [r.rollout_id for r in cancelled] == ids
    assert [r.status for r in await store.query_rollouts()] == ["cancelled", "queuing", "cancelled"]


async def test_a_closed_store_refuses_every_operation(store: Store, backend: str) -> None:
    if backend == "http":
        pytest.skip("closing a client closes its connections only; the server's store stays open")
    claimed = await claim_new(store)
    rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
    await store.close()
    calls = {
        "enqueue": lambda: store.enqueue([request()]),
        "start_rollout": lambda: store.start_rollout(request(), "w1"),
        "claim": lambda: store.claim("w1"),
        "get_rollout": lambda: store.get_rollout(rollout_id),
        "query_rollouts": lambda: store.query_rollouts(),
        "cancel": lambda: store.cancel([rollout_id]),
        "start_attempt": lambda: store.start_attempt(rollout_id, "w1"),
        "update_attempt": lambda: store.update_attempt(rollout_id, attempt_id, status="succeeded"),
        "list_attempts": lambda: store.list_attempts(rollout_id),
        "add_spans": lambda: store.add_spans([span(rollout_id, attempt_id)]),
        "query_spans": lambda: store.query_spans(rollout_id),
        "put_resources": lambda: store.put_resources({}),
        "get_resources": lambda: store.get_resources(),
        "heartbeat": lambda: store.heartbeat("w1", {}),
        "list_workers": lambda: store.list_workers(),
        "wait": lambda: store.wait([rollout_id], 0),
        "stats": lambda: store.stats(),
    }
    refused: dict[str, str] = {}
    for name, call in calls.items():
        try:
            await call()
        except ValidationError as error:
            refused[name] = str(error)
    assert sorted(refused) == sorted(calls)
    assert all("closed" in message for message in refused.values()), refused
