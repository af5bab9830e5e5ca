"""Store conformance: unknown ids, invalid payloads, and that a rejected call writes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from storetools import counts, request, span

from fulgor.errors import FulgorError, InvalidTransitionError, NotFoundError, ValidationError
from fulgor.store.base import Store
from fulgor.types import LLM, AttemptedRollout, PromptTemplate, SpanEvent

Call = Callable[[Store, AttemptedRollout], Awaitable[Any]]


async def setup(store: Store) -> AttemptedRollout:
    """One queued rollout and one claimed (preparing) rollout; returns the claimed one."""
    await store.enqueue([request({"n": 0})])
    (claimed,) = await store.claim("w1")
    await store.enqueue([request({"n": 1})])
    return claimed


async def snapshot(store: Store) -> tuple[Any, ...]:
    """Everything a rejected call could have written, as comparable values."""
    rollouts = await store.query_rollouts()
    attempts = [await store.list_attempts(r.rollout_id) for r in rollouts]
    spans = [await store.query_spans(r.rollout_id) for r in rollouts]
    return (
        counts(await store.stats()),
        rollouts,
        attempts,
        spans,
        await store.list_workers(),
        await store.get_resources(),
    )


UNKNOWN_IDS: dict[str, Call] = {
    "get_rollout": lambda s, c: s.get_rollout("ro-missing"),
    "list_attempts": lambda s, c: s.list_attempts("ro-missing"),
    "start_attempt": lambda s, c: s.start_attempt("ro-missing", "w1"),
    "update_attempt rollout": lambda s, c: s.update_attempt(
        "ro-missing", c.attempt.attempt_id, status="succeeded"
    ),
    "update_attempt attempt": lambda s, c: s.update_attempt(c.rollout_id, "at-missing", status="succeeded"),
    "query_spans rollout": lambda s, c: s.query_spans("ro-missing"),
    "query_spans attempt": lambda s, c: s.query_spans(c.rollout_id, "at-missing"),
    "cancel": lambda s, c: s.cancel([c.rollout_id, "ro-missing"]),
    "wait": lambda s, c: s.wait([c.rollout_id, "ro-missing"], timeout_seconds=0),
    "get_resources": lambda s, c: s.get_resources("res-missing"),
    "add_spans rollout": lambda s, c: s.add_spans(
        [span(c.rollout_id, c.attempt.attempt_id), span("ro-x", "at-x")]
    ),
    "add_spans attempt": lambda s, c: s.add_spans(
        [span(c.rollout_id, c.attempt.attempt_id), span(c.rollout_id, "at-missing")]
    ),
}


@pytest.mark.parametrize("call", UNKNOWN_IDS.values(), ids=UNKNOWN_IDS.keys())
async def test_unknown_id_raises_not_found_and_writes_nothing(store: Store, call: Call) -> None:
    claimed = await setup(store)
    before = await snapshot(store)

    with pytest.raises(NotFoundError) as raised:
        await call(store, claimed)

    assert "missing" in str(raised.value) or "-x" in str(raised.value)
    assert await snapshot(store) == before


EMPTY_IDS: dict[str, Call] = {
    "get_rollout": lambda s, c: s.get_rollout(""),
    "list_attempts": lambda s, c: s.list_attempts(""),
    "start_attempt": lambda s, c: s.start_attempt("", "w1"),
    "update_attempt rollout": lambda s, c: s.update_attempt("", c.attempt.attempt_id, metadata={}),
    "update_attempt attempt": lambda s, c: s.update_attempt(c.rollout_id, "", metadata={}),
    "query_spans rollout": lambda s, c: s.query_spans(""),
    "query_spans attempt": lambda s, c: s.query_spans(c.rollout_id, ""),
    "get_resources": lambda s, c: s.get_resources(""),
    "cancel": lambda s, c: s.cancel([""]),
}


@pytest.mark.parametrize("call", EMPTY_IDS.values(), ids=EMPTY_IDS.keys())
async def test_an_empty_id_is_not_found_like_any_unknown_one(store: Store, call: Call) -> None:
    # Over HTTP an empty id makes an empty path segment: still the store's NotFoundError.
    claimed = await setup(store)
    before = await snapshot(store)

    with pytest.raises(NotFoundError, match="''"):
        await call(store, claimed)

    assert await snapshot(store) == before


async def test_update_attempt_of_another_rollout_is_not_found(store: Store) -> None:
    claimed = await setup(store)
    (other,) = await store.claim("w2")

    with pytest.raises(NotFoundError):
        await store.update_attempt(claimed.rollout_id, other.attempt.attempt_id, status="succeeded")

    assert (await store.get_rollout(other.rollout_id)).status == "preparing"


class NotJson:
    pass


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


INVALID: dict[str, tuple[str, Call]] = {
    "enqueue input object": (
        "requests[1].input",
        lambda s, c: s.enqueue([request({"ok": 1}), request({"bad": NotJson()})]),
    ),
    "enqueue input set": ("requests[0].input", lambda s, c: s.enqueue([request({1, 2})])),
    "enqueue input nan": (
        "requests[1].input",
        lambda s, c: s.enqueue([request(), request({"x": float("nan")})]),
    ),
    "enqueue metadata": (
        "requests[1].metadata",
        lambda s, c: s.enqueue([request(), request(metadata={"m": NotJson()})]),
    ),
    "enqueue not a request": ("requests[1]", lambda s, c: s.enqueue([request(), {"input": 1}])),
    "start_rollout input": ("input", lambda s, c: s.start_rollout(request(NotJson()), "w1")),
    "start_rollout worker_id": ("worker_id", lambda s, c: s.start_rollout(request(), "")),
    "claim worker_id": ("worker_id", lambda s, c: s.claim("")),
    "claim long worker_id": ("worker_id", lambda s, c: s.claim("w" * 257)),
    "claim limit 0": ("limit", lambda s, c: s.claim("w1", limit=0)),
    "claim limit negative": ("limit", lambda s, c: s.claim("w1", limit=-1)),
    "claim wait_seconds": ("wait_seconds", lambda s, c: s.claim("w1", wait_seconds=-1)),
    "start_attempt worker_id": ("worker_id", lambda s, c: s.start_attempt(c.rollout_id, "")),
    "update_attempt metadata": (
        "metadata",
        lambda s, c: s.update_attempt(
            c.rollout_id, c.attempt.attempt_id, status="succeeded", metadata={"x": NotJson()}
        ),
    ),
    "update_attempt status": (
        "status",
        lambda s, c: s.update_attempt(c.rollout_id, c.attempt.attempt_id, status="finished"),
    ),
    "add_spans not a span": (
        "spans[1]",
        lambda s, c: s.add_spans([span(c.rollout_id, c.attempt.attempt_id), {"name": "x"}]),
    ),
    "add_spans attributes": (
        "spans[1].attributes",
        lambda s, c: s.add_spans(
            [
                span(c.rollout_id, c.attempt.attempt_id),
                span(c.rollout_id, c.attempt.attempt_id, attributes={"a": NotJson()}),
            ]
        ),
    ),
    "add_spans resource": (
        "spans[1].resource",
        lambda s, c: s.add_spans(
            [
                span(c.rollout_id, c.attempt.attempt_id),
                span(c.rollout_id, c.attempt.attempt_id, resource={"r": NotJson()}),
            ]
        ),
    ),
    "add_spans event attributes": (
        "spans[0].events",
        lambda s, c: s.add_spans(
            [
                span(
                    c.rollout_id,
                    c.attempt.attempt_id,
                    events=(SpanEvent(name="e", time=1.0, attributes={"a": NotJson()}),),
                )
            ]
        ),
    ),
    "add_spans nan start_time": (
        "spans[1].start_time",
        lambda s, c: s.add_spans(
            [
                span(c.rollout_id, c.attempt.attempt_id),
                span(c.rollout_id, c.attempt.attempt_id, start_time=float("nan")),
            ]
        ),
    ),
    "query_rollouts limit": ("limit", lambda s, c: s.query_rollouts(limit=-1)),
    "query_rollouts offset": ("offset", lambda s, c: s.query_rollouts(offset=-1)),
    "query_rollouts order": ("order", lambda s, c: s.query_rollouts(order="sideways")),
    "query_spans limit": ("limit", lambda s, c: s.query_spans(c.rollout_id, limit=-1)),
    "query_spans offset": ("offset", lambda s, c: s.query_spans(c.rollout_id, offset=-1)),
    "put_resources id": (
        "resources_id",
        lambda s, c: s.put_resources({"p": PromptTemplate(template="x")}, ""),
    ),
    "put_resources not a dict": ("resources", lambda s, c: s.put_resources([PromptTemplate(template="x")])),
    "put_resources value": (
        "resources['bad']",
        lambda s, c: s.put_resources({"ok": LLM(endpoint="http://x/v1", model="m"), "bad": {"kind": "llm"}}),
    ),
    "heartbeat worker_id": ("worker_id", lambda s, c: s.heartbeat("")),
    "heartbeat stats": ("stats", lambda s, c: s.heartbeat("w9", {"s": NotJson()})),
    "wait timeout": ("timeout_seconds", lambda s, c: s.wait([c.rollout_id], timeout_seconds=-1)),
    # Not-a-number passes every "< 0" check and then never runs out: a busy loop, not a wait.
    "claim wait_seconds nan": ("wait_seconds", lambda s, c: s.claim("w1", wait_seconds=float("nan"))),
    "claim wait_seconds inf": ("wait_seconds", lambda s, c: s.claim("w1", wait_seconds=float("inf"))),
    "wait timeout nan": (
        "timeout_seconds",
        lambda s, c: s.wait([c.rollout_id], timeout_seconds=float("nan")),
    ),
    # Non-finite numbers are not JSON: stored, they would break every later read of the span.
    "add_spans event time inf": (
        "spans[1].events[0].time",
        lambda s, c: s.add_spans(
            [
                span(c.rollout_id, c.attempt.attempt_id),
                span(c.rollout_id, c.attempt.attempt_id, events=(SpanEvent(name="e", time=float("inf")),)),
            ]
        ),
    ),
    "put_resources sampling nan": (
        "resources['llm'].sampling_parameters",
        lambda s, c: s.put_resources(
            {"llm": LLM(endpoint="http://x/v1", model="m", sampling_parameters={"temperature": float("nan")})}
        ),
    ),
    # NUL characters: PostgreSQL's text cannot hold them, so no backend accepts them in ids or names.
    "heartbeat worker_id NUL": ("worker_id", lambda s, c: s.heartbeat("w\x00x")),
    "claim worker_id NUL": ("worker_id", lambda s, c: s.claim("w\x00x")),
    "enqueue group_id NUL": ("requests[0].group_id", lambda s, c: s.enqueue([request(group_id="g\x00")])),
    "add_spans name NUL": (
        "spans[0].name",
        lambda s, c: s.add_spans([span(c.rollout_id, c.attempt.attempt_id, name="a\x00b")]),
    ),
    "add_spans span_id NUL": (
        "spans[0].span_id",
        lambda s, c: s.add_spans([span(c.rollout_id, c.attempt.attempt_id, span_id="s\x00")]),
    ),
    "get_rollout NUL": ("rollout_id", lambda s, c: s.get_rollout("ro-\x00")),
    "query_rollouts group_id NUL": ("group_id", lambda s, c: s.query_rollouts(group_id="g\x00")),
    "query_spans name NUL": ("name", lambda s, c: s.query_spans(c.rollout_id, name="n\x00")),
    "get_resources NUL": ("resources_id", lambda s, c: s.get_resources("r\x00")),
    "cancel NUL": ("rollout_ids[0]", lambda s, c: s.cancel(["ro-\x00"])),
    # update_attempt's own inputs: a JSON object, a string error, a status string.
    "update_attempt metadata list": (
        "metadata",
        lambda s, c: s.update_attempt(c.rollout_id, c.attempt.attempt_id, metadata=["a", "b"]),
    ),
    "update_attempt error not a string": (
        "error",
        lambda s, c: s.update_attempt(c.rollout_id, c.attempt.attempt_id, status="failed", error=5),
    ),
    # The limits of fulgor.limits: nesting pydantic could not read back, ids past their length, text
    # no database can store.
    "enqueue input nested too deep": ("MAX_JSON_DEPTH", lambda s, c: s.enqueue([request(deep(150))])),
    "add_spans attributes nested too deep": (
        "spans[0].attributes",
        lambda s, c: s.add_spans([span(c.rollout_id, c.attempt.attempt_id, attributes={"x": deep(150)})]),
    ),
    "heartbeat stats nested too deep": ("MAX_JSON_DEPTH", lambda s, c: s.heartbeat("w1", {"s": deep(150)})),
    "get_rollout id too long": ("MAX_ID_CHARS", lambda s, c: s.get_rollout("r" * 1000)),
    "cancel id too long": ("rollout_ids[0]", lambda s, c: s.cancel(["r" * 1000])),
    "add_spans lone surrogate": (
        "spans[0].attributes",
        lambda s, c: s.add_spans([span(c.rollout_id, c.attempt.attempt_id, attributes={"x": "\ud800"})]),
    ),
    "update_attempt metadata lone surrogate": (
        "metadata",
        lambda s, c: s.update_attempt(c.rollout_id, c.attempt.attempt_id, metadata={"\udc00": 1}),
    ),
    "heartbeat attempt_ids a string": ("attempt_ids", lambda s, c: s.heartbeat("w1", attempt_ids="at-1")),
    "heartbeat attempt_ids not strings": ("attempt_ids[0]", lambda s, c: s.heartbeat("w1", attempt_ids=[5])),
}


@pytest.mark.parametrize(("field", "call"), INVALID.values(), ids=INVALID.keys())
async def test_invalid_payload_raises_validation_error_naming_the_field(
    store: Store, field: str, call: Call
) -> None:
    claimed = await setup(store)
    before = await snapshot(store)

    with pytest.raises(ValidationError) as raised:
        await call(store, claimed)

    assert field in str(raised.value)
    assert raised.value.code == "validation_error"
    assert await snapshot(store) == before


async def test_store_errors_share_one_root(store: Store) -> None:
    claimed = await setup(store)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")

    for call in (
        store.get_rollout("ro-missing"),
        store.claim(""),
        store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="failed"),
    ):
        with pytest.raises(FulgorError):
            await call


async def test_rejected_transition_writes_nothing(store: Store) -> None:
    claimed = await setup(store)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="running")
    before = await snapshot(store)

    with pytest.raises(InvalidTransitionError):
        await store.update_attempt(
            claimed.rollout_id, claimed.attempt.attempt_id, status="preparing", error="e", metadata={"m": 1}
        )

    assert await snapshot(store) == before
