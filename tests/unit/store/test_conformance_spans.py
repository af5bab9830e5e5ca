"""Store conformance: add_spans and query_spans, on every backend."""

from __future__ import annotations

import pytest
from storetools import FakeClock, request, span

from fulgor.errors import NotFoundError
from fulgor.store.base import LATEST, Store
from fulgor.types import AttemptedRollout, SpanEvent, SpanStatus


async def claim_new(store: Store, **config: object) -> AttemptedRollout:
    await store.enqueue([request(**config)])  # type: ignore[arg-type]
    (claimed,) = await store.claim("w1")
    return claimed


async def test_sequence_ids_start_at_one_and_increase_per_attempt(store: Store) -> None:
    claimed = await claim_new(store)
    other = await claim_new(store)
    rid, aid = claimed.rollout_id, claimed.attempt.attempt_id

    first = await store.add_spans([span(rid, aid), span(rid, aid)])
    mixed = await store.add_spans([span(other.rollout_id, other.attempt.attempt_id), span(rid, aid)])

    assert [s.sequence_id for s in first] == [1, 2]
    assert [s.sequence_id for s in mixed] == [1, 3]
    stored = await store.query_spans(rid)
    assert [s.sequence_id for s in stored] == [1, 2, 3]
    assert [s.span_id for s in stored] == [first[0].span_id, first[1].span_id, mixed[1].span_id]


async def test_stored_span_keeps_every_field(store: Store) -> None:
    claimed = await claim_new(store)
    given = span(
        claimed.rollout_id,
        claimed.attempt.attempt_id,
        name="fulgor.model_call",
        parent_id="parent",
        end_time=1_700_000_001.5,
        attributes={"a": [1, 2.5, "x", None, {"b": True}]},
        events=(SpanEvent(name="e", time=1_700_000_001.0, attributes={"k": "v"}),),
        status=SpanStatus(code="error", message="boom"),
        resource={"service.name": "agent"},
    )

    (stored,) = await store.add_spans([given])

    assert stored == given.model_copy(update={"sequence_id": 1})
    assert await store.query_spans(claimed.rollout_id) == [stored]


async def test_re_adding_a_span_id_returns_the_stored_span(store: Store) -> None:
    claimed = await claim_new(store)
    rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
    (original,) = await store.add_spans([span(rid, aid, span_id="s-1", name="first")])
    await store.add_spans([span(rid, aid, span_id="s-2")])
    spans_before = (await store.stats()).spans

    again = await store.add_spans(
        [span(rid, aid, span_id="s-1", name="changed"), span(rid, aid, span_id="s-3")]
    )

    assert again[0] == original
    assert again[1].sequence_id == 3
    assert (await store.stats()).spans == spans_before + 1
    assert [s.span_id for s in await store.query_spans(rid)] == ["s-1", "s-2", "s-3"]


async def test_a_span_id_repeated_within_one_call_is_stored_once(store: Store) -> None:
    claimed = await claim_new(store)
    rid, aid = claimed.rollout_id, claimed.attempt.attempt_id

    stored = await store.add_spans(
        [span(rid, aid, span_id="dup", name="a"), span(rid, aid, span_id="dup", name="b")]
    )

    assert stored[0] == stored[1]
    assert (stored[0].sequence_id, stored[0].name) == (1, "a")
    assert (await store.stats()).spans == 1


async def test_the_same_span_id_in_two_attempts_is_two_spans(store: Store) -> None:
    claimed = await claim_new(store, max_attempts=2)
    rid = claimed.rollout_id
    await store.add_spans([span(rid, claimed.attempt.attempt_id, span_id="same")])
    await store.update_attempt(rid, claimed.attempt.attempt_id, status="failed")
    (again,) = await store.claim("w1")

    (second,) = await store.add_spans([span(rid, again.attempt.attempt_id, span_id="same")])

    assert (second.attempt_id, second.sequence_id) == (again.attempt.attempt_id, 1)
    assert len(await store.query_spans(rid)) == 2


async def test_a_span_moves_a_preparing_attempt_to_running(store: Store, clock: FakeClock) -> None:
    claimed = await claim_new(store)
    clock.advance(7)

    await store.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id)])

    (attempt,) = await store.list_attempts(claimed.rollout_id)
    assert (attempt.status, attempt.last_active_time) == ("running", clock.now)
    assert (await store.get_rollout(claimed.rollout_id)).status == "running"


@pytest.mark.parametrize("end", ["succeeded", "failed", "timeout", "unresponsive"])
async def test_late_spans_are_kept_and_change_no_status(store: Store, clock: FakeClock, end: str) -> None:
    claimed = await claim_new(store, max_attempts=2)
    rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
    await store.update_attempt(rid, aid, status=end)
    rollout_before = await store.get_rollout(rid)
    attempts_before = await store.list_attempts(rid)
    clock.advance(1)

    (late,) = await store.add_spans([span(rid, aid, name="late")])

    assert late.sequence_id == 1
    assert [s.name for s in await store.query_spans(rid, aid)] == ["late"]
    assert await store.get_rollout(rid) == rollout_before
    assert await store.list_attempts(rid) == attempts_before


async def test_late_span_for_an_old_attempt_leaves_the_new_one_alone(store: Store) -> None:
    claimed = await claim_new(store, max_attempts=2)
    rid = claimed.rollout_id
    await store.update_attempt(rid, claimed.attempt.attempt_id, status="failed")
    (again,) = await store.claim("w2")

    await store.add_spans([span(rid, claimed.attempt.attempt_id)])

    assert [a.status for a in await store.list_attempts(rid)] == ["failed", "preparing"]
    assert (await store.get_rollout(rid)).status == "preparing"
    assert again.attempt.sequence_id == 2


async def test_late_span_for_a_cancelled_rollout(store: Store) -> None:
    claimed = await claim_new(store)
    await store.cancel([claimed.rollout_id])

    await store.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id)])

    assert (await store.get_rollout(claimed.rollout_id)).status == "cancelled"
    assert len(await store.query_spans(claimed.rollout_id)) == 1


# -- query_spans ------------------------------------------------------------------------------------


async def rollout_with_two_attempts(store: Store) -> tuple[str, str, str]:
    claimed = await claim_new(store, max_attempts=2)
    rid, first = claimed.rollout_id, claimed.attempt.attempt_id
    await store.add_spans(
        [span(rid, first, name="llm"), span(rid, first, name="tool"), span(rid, first, name="llm")]
    )
    await store.update_attempt(rid, first, status="failed")
    (again,) = await store.claim("w1")
    second = again.attempt.attempt_id
    await store.add_spans([span(rid, second, name="llm"), span(rid, second, name="reward")])
    return rid, first, second


async def test_query_spans_all_one_attempt_or_latest(store: Store) -> None:
    rid, first, second = await rollout_with_two_attempts(store)

    everything = await store.query_spans(rid)
    assert [(s.attempt_id, s.sequence_id) for s in everything] == [
        (first, 1),
        (first, 2),
        (first, 3),
        (second, 1),
        (second, 2),
    ]
    assert [s.name for s in await store.query_spans(rid, first)] == ["llm", "tool", "llm"]
    assert [s.name for s in await store.query_spans(rid, LATEST)] == ["llm", "reward"]
    assert await store.query_spans(rid, second) == await store.query_spans(rid, "latest")


async def test_query_spans_by_name_with_limit_and_offset(store: Store) -> None:
    rid, first, second = await rollout_with_two_attempts(store)

    llm = await store.query_spans(rid, name="llm")
    assert [(s.attempt_id, s.sequence_id) for s in llm] == [(first, 1), (first, 3), (second, 1)]
    assert await store.query_spans(rid, name="llm", limit=2) == llm[:2]
    assert await store.query_spans(rid, name="llm", offset=1) == llm[1:]
    assert await store.query_spans(rid, name="llm", limit=1, offset=1) == llm[1:2]
    assert await store.query_spans(rid, limit=0) == []
    assert await store.query_spans(rid, offset=10) == []
    assert [s.name for s in await store.query_spans(rid, first, name="tool")] == ["tool"]
    assert await store.query_spans(rid, name="nothing") == []


async def test_query_spans_of_a_rollout_without_attempts(store: Store) -> None:
    (rollout,) = await store.enqueue([request()])

    assert await store.query_spans(rollout.rollout_id) == []
    assert await store.query_spans(rollout.rollout_id, LATEST) == []


async def test_query_spans_with_an_attempt_of_another_rollout(store: Store) -> None:
    one = await claim_new(store)
    other = await claim_new(store)

    with pytest.raises(NotFoundError):
        await store.query_spans(one.rollout_id, other.attempt.attempt_id)
