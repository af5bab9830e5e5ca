"""Span records an older version stored past today's limits: skipped, counted, never trained on.

Such a record is written straight into a real SQLite file and a real PostgreSQL schema, as the old
version wrote it, and read back through the store, the HTTP API (``fulgor serve`` on loopback) and
the Trainer's ``read_outcome``: the store skips it and counts it in ``spans_unreadable``, the
rollout that holds it is not trained on, and a healthy rollout beside it still is.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from fulgor import semconv
from fulgor.net.asgi import serve_asgi
from fulgor.server import ServerConfig, create_app
from fulgor.store.base import LATEST, Store
from fulgor.store.client import StoreClient
from fulgor.store.sqlite import SqliteStore
from fulgor.training.rollouts import read_outcome
from fulgor.types import AttemptedRollout, ModelCall, Rollout, RolloutRequest, Span

START = 1_700_000_000.0
# pydantic's JSON parser stops at 200 levels: what an older version stored 250 levels deep never reads.
OLD_DEPTH = 250

RawInsert = Callable[[Span, str], Awaitable[None]]


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def span(attempted: AttemptedRollout, span_id: str, name: str, attributes: dict[str, Any]) -> Span:
    return Span(
        rollout_id=attempted.rollout_id,
        attempt_id=attempted.attempt.attempt_id,
        trace_id="t" * 32,
        span_id=span_id,
        name=name,
        start_time=START,
        attributes=attributes,
    )


def model_call_span(attempted: AttemptedRollout) -> Span:
    call = ModelCall(
        request={"messages": [{"role": "user", "content": "2+2?"}]},
        response={"message": {"role": "assistant", "content": "4"}},
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.1, -0.2],
    )
    attributes = {semconv.ATTR_MODEL_CALL: call.model_dump(mode="json")}
    return span(attempted, "call-1", semconv.SPAN_MODEL_CALL, attributes)


def reward_span(attempted: AttemptedRollout) -> Span:
    attributes = {semconv.ATTR_REWARD_VALUE: 1.0, semconv.ATTR_REWARD_PRIMARY: "reward"}
    return span(attempted, "reward-1", semconv.SPAN_REWARD, attributes)


def old_record(attempted: AttemptedRollout, sequence_id: int) -> tuple[Span, str]:
    """A span as the older version stored it: attributes nested ``OLD_DEPTH`` levels, in its body."""
    stored = span(attempted, "old-1", "agent.step", {}).model_copy(update={"sequence_id": sequence_id})
    body = json.loads(stored.model_dump_json())
    body["attributes"] = {"deep": nested(OLD_DEPTH)}
    return stored, json.dumps(body)


async def claimed(store: Store) -> AttemptedRollout:
    await store.enqueue([RolloutRequest(input=1)])
    (attempted,) = await store.claim("w1")
    return attempted


async def rollout_with_spans(store: Store, insert: RawInsert | None) -> Rollout:
    """A succeeded rollout with a model call and a reward, and between them, when ``insert`` is
    given, a record the older version stored."""
    attempted = await claimed(store)
    await store.add_spans([model_call_span(attempted)])
    if insert is not None:
        await insert(*old_record(attempted, 2))
    await store.add_spans([reward_span(attempted)])
    await store.update_attempt(attempted.rollout_id, attempted.attempt.attempt_id, status="succeeded")
    return await store.get_rollout(attempted.rollout_id)


async def sqlite_store(tmp_path: Path) -> tuple[Store, RawInsert]:
    path = tmp_path / "store.sqlite"
    store = SqliteStore(path)

    async def insert(stored: Span, body: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT INTO spans (rollout_id, attempt_seq, attempt_id, sequence_id, span_id, name, body) "
                "VALUES (?, 1, ?, ?, ?, ?, ?)",
                (stored.rollout_id, stored.attempt_id, stored.sequence_id, stored.span_id, stored.name, body),
            )
            conn.execute(
                "UPDATE attempts SET span_count = ? WHERE attempt_id = ?",
                (stored.sequence_id, stored.attempt_id),
            )

    return store, insert


async def postgres_store(tmp_path: Path) -> tuple[Store, RawInsert]:
    from tests.unit.store.pgtools import postgres_url, schema_for

    url = postgres_url()
    pytest.importorskip("psycopg")
    import psycopg
    from psycopg import sql

    from fulgor.store.postgres import PostgresStore

    schema = schema_for(tmp_path, url)
    store = PostgresStore(url, schema=schema)
    await store.open()

    async def insert(stored: Span, body: str) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {}.spans (rollout_id, attempt_seq, attempt_id, sequence_id, span_id, name, "
                    "body) VALUES (%s, 1, %s, %s, %s, %s, %s)"
                ).format(sql.Identifier(schema)),
                (stored.rollout_id, stored.attempt_id, stored.sequence_id, stored.span_id, stored.name, body),
            )
            await conn.execute(
                sql.SQL("UPDATE {}.attempts SET span_count = %s WHERE attempt_id = %s").format(
                    sql.Identifier(schema)
                ),
                (stored.sequence_id, stored.attempt_id),
            )

    return store, insert


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Store, RawInsert]]:
    make = sqlite_store if request.param == "sqlite" else postgres_store
    store, insert = await make(tmp_path)
    yield store, insert
    await store.close()


async def test_a_record_an_older_version_stored_is_skipped_counted_and_never_trained_on(
    backend: tuple[Store, RawInsert],
) -> None:
    store, insert = backend
    healthy = await rollout_with_spans(store, None)
    broken = await rollout_with_spans(store, insert)

    # The store itself: the other spans of the rollout, and the one it skipped, counted.
    spans = await store.query_spans(broken.rollout_id)
    assert [s.span_id for s in spans] == ["call-1", "reward-1"]
    assert getattr(spans, "spans_unreadable", None) == 1
    assert getattr(await store.query_spans(healthy.rollout_id), "spans_unreadable", None) == 0

    # Over HTTP, from a server on the same database: the same spans and the same count.
    app = create_app(ServerConfig(store=store, close_store=False))
    async with serve_asgi(app) as url:
        client = StoreClient(url, max_retries=0)
        try:
            over_http = await client.query_spans(broken.rollout_id, LATEST)
            assert [s.span_id for s in over_http] == ["call-1", "reward-1"]
            assert getattr(over_http, "spans_unreadable", None) == 1
            async with httpx.AsyncClient() as http:
                answer = await http.get(f"{url}/api/v1/rollouts/{broken.rollout_id}/spans")
            assert answer.status_code == 200
            assert answer.headers["x-fulgor-spans-unreadable"] == "1"
            assert len(answer.json()) == 2

            # The Trainer's read of each ended rollout: the broken one is counted and left out, and
            # the healthy one beside it is trained on, from the store and over HTTP alike.
            for reader in (store, client):
                outcome = await read_outcome(reader, broken)
                assert (outcome.trajectory, outcome.drift.spans_unreadable) == (None, 1)
                assert outcome.error is not None
                assert "could not be read back" in outcome.error
                assert outcome.model_calls == 1
                trained = await read_outcome(reader, healthy)
                assert trained.trajectory is not None
                assert trained.drift.spans_unreadable == 0
                assert trained.sampled_tokens == 2
        finally:
            await client.close()


async def test_a_record_stored_just_under_the_parsers_limit_reads_over_http_too(tmp_path: Path) -> None:
    # Nested 198 levels, the record reads in the store (its body is 200 levels deep, pydantic's
    # limit), but the HTTP answer's list adds a level around every span: the client then reads the
    # spans one by one instead of failing every span of the answer.
    store, insert = await sqlite_store(tmp_path)
    attempted = await claimed(store)
    await store.add_spans([model_call_span(attempted)])
    stored, _ = old_record(attempted, 2)
    body = json.loads(stored.model_dump_json())
    body["attributes"] = {"deep": nested(198)}
    await insert(stored, json.dumps(body))
    try:
        assert len(await store.query_spans(attempted.rollout_id)) == 2
        async with serve_asgi(create_app(ServerConfig(store=store, close_store=False))) as url:
            client = StoreClient(url, max_retries=0)
            spans = await client.query_spans(attempted.rollout_id)
            await client.close()
        assert [s.span_id for s in spans] == ["call-1", "old-1"]
    finally:
        await store.close()


async def test_a_malformed_model_call_or_reward_span_is_counted_and_does_not_stop_training(
    tmp_path: Path,
) -> None:
    # Any agent or OTLP exporter may send spans named fulgor.model_call or fulgor.reward; one whose
    # call is not a ModelCall, or whose value is not a number, made read_outcome raise.
    store = SqliteStore(tmp_path / "store.sqlite")
    try:
        attempted = await claimed(store)
        await store.add_spans(
            [
                model_call_span(attempted),
                span(attempted, "bad-call", semconv.SPAN_MODEL_CALL, {semconv.ATTR_MODEL_CALL: "garbage"}),
                span(attempted, "bad-reward", semconv.SPAN_REWARD, {semconv.ATTR_REWARD_VALUE: "NaN"}),
                reward_span(attempted),
            ]
        )
        await store.update_attempt(attempted.rollout_id, attempted.attempt.attempt_id, status="succeeded")

        outcome = await read_outcome(store, await store.get_rollout(attempted.rollout_id))

        assert (outcome.trajectory, outcome.drift.spans_unreadable, outcome.reward) == (None, 2, 1.0)
    finally:
        await store.close()
