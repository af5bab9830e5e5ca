"""PostgresStore beyond the conformance suite: URLs, schemas, errors, and concurrent writers.

Tests marked ``postgres`` need the server from FULGOR_TEST_POSTGRES_URL (skipped without it).
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pgtools import postgres_url, schema_for

from fulgor.errors import ConfigError, InvalidTransitionError, StoreUnavailableError, ValidationError
from fulgor.store import open_store
from fulgor.store.postgres import PostgresStore
from fulgor.types import RolloutRequest


def test_open_store_reads_the_schema_from_the_url() -> None:
    store = open_store(
        "postgresql://fulgor:secret@db.example:5433/runs?sslmode=disable&schema=team_a&options=-c%20x%3Dy"
    )

    default = open_store("postgres://fulgor@db.example/runs")

    assert isinstance(store, PostgresStore)
    assert isinstance(default, PostgresStore)
    assert (store.schema, default.schema) == ("team_a", "fulgor")
    # fulgor's own parameter is gone; libpq's stay exactly as written.
    assert (
        store._db._conninfo
        == "postgresql://fulgor:secret@db.example:5433/runs?sslmode=disable&options=-c%20x%3Dy"
    )


@pytest.mark.parametrize("schema", ["", "Upper", "1st", "a-b", "x" * 51, 'x"; DROP TABLE rollouts; --'])
def test_schema_names_are_plain_identifiers(schema: str) -> None:
    with pytest.raises(ValidationError, match="schema"):
        PostgresStore("postgresql://127.0.0.1/db", schema=schema)


async def test_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    store = PostgresStore("postgresql://127.0.0.1/db")

    with pytest.raises(ImportError, match=r"fulgor\[postgres\]"):
        await store.get_rollout("ro-1")


async def test_an_unreachable_server_is_unavailable_without_the_password() -> None:
    pytest.importorskip("psycopg")
    store = PostgresStore("postgresql://fulgor:hunter2@127.0.0.1:1/runs", connect_timeout_seconds=2)

    # Unavailable (a 503 the client retries), not a bad request.
    with pytest.raises(StoreUnavailableError, match=re.escape("127.0.0.1:1/runs")) as raised:
        await store.enqueue([RolloutRequest(input=1)])

    assert "hunter2" not in str(raised.value)
    assert "server is running" in str(raised.value)
    await store.close()


@pytest.fixture
def url() -> str:
    return postgres_url()


@pytest.fixture
async def store(url: str, tmp_path: Path) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(url, schema=schema_for(tmp_path, url))
    yield opened
    await opened.close()


@pytest.mark.postgres
async def test_create_false_needs_an_existing_store(url: str, tmp_path: Path) -> None:
    missing = PostgresStore(url, schema=schema_for(tmp_path, url), create=False)

    with pytest.raises(ConfigError, match="no fulgor store in schema"):
        await missing.open()
    await missing.close()


@pytest.mark.postgres
async def test_opening_twice_and_reopening_keep_the_data(store: PostgresStore, url: str) -> None:
    await store.open()
    await store.open()
    (rollout,) = await store.enqueue([RolloutRequest(input={"keys": {"b": 1, "a": 2}})])

    again = PostgresStore(url, schema=store.schema, create=False)
    try:
        assert await again.get_rollout(rollout.rollout_id) == rollout
        assert list((await again.get_rollout(rollout.rollout_id)).input["keys"]) == ["b", "a"]
    finally:
        await again.close()


@pytest.mark.postgres
async def test_opening_an_existing_store_does_not_wait_for_its_writers(
    store: PostgresStore, url: str
) -> None:
    """A store opening beside a transaction that writes rollouts takes no table lock to wait on."""
    import psycopg
    from psycopg import sql

    (rollout,) = await store.enqueue([RolloutRequest(input=1)])
    writer = await psycopg.AsyncConnection.connect(url, autocommit=True)
    other = PostgresStore(url, schema=store.schema)
    try:
        await writer.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        async with writer.transaction():
            await writer.execute(
                "UPDATE rollouts SET metadata = metadata WHERE rollout_id = %s", (rollout.rollout_id,)
            )
            await asyncio.wait_for(other.open(), timeout=10)
        assert (await other.get_rollout(rollout.rollout_id)).input == 1
    finally:
        await other.close()
        await writer.close()


@pytest.mark.postgres
async def test_schemas_are_separate_stores(store: PostgresStore, url: str, tmp_path: Path) -> None:
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = PostgresStore(url, schema=schema_for(other_dir, url))
    try:
        await store.enqueue([RolloutRequest(input=1)])

        assert await other.claim("w", wait_seconds=0.2) == []
        assert (await other.stats()).rollouts == {}
    finally:
        await other.close()


@pytest.mark.postgres
async def test_concurrent_claims_on_one_store_are_exactly_once(store: PostgresStore) -> None:
    created = await store.enqueue([RolloutRequest(input=i) for i in range(300)])

    async def drain(worker_id: str) -> list[str]:
        taken = []
        while batch := await store.claim(worker_id, limit=2):
            taken += [item.rollout_id for item in batch]
        return taken

    results = await asyncio.gather(*(drain(f"w{i}") for i in range(12)))

    claimed = [rollout_id for result in results for rollout_id in result]
    assert sorted(claimed) == sorted(rollout.rollout_id for rollout in created)


@pytest.mark.postgres
async def test_crossing_writers_on_the_same_rollouts_all_complete(
    store: PostgresStore, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancels in opposite orders, updates and heartbeats on shared rows: no call fails or deadlocks."""
    caplog.set_level(logging.DEBUG, logger="fulgor.store._postgres_db")
    other = PostgresStore(url, schema=store.schema)
    try:
        rollouts = await store.enqueue([RolloutRequest(input=i) for i in range(40)])
        claimed = {c.rollout_id: c for c in await store.claim("w1", limit=40)}
        ids = [rollout.rollout_id for rollout in rollouts]

        async def cancel(target: PostgresStore, chunk: list[str]) -> None:
            try:
                await target.cancel(chunk)
            except InvalidTransitionError:
                pass  # a rollout in the chunk had already succeeded

        async def finish(target: PostgresStore, rollout_id: str) -> None:
            try:
                attempt_id = claimed[rollout_id].attempt.attempt_id
                await target.update_attempt(rollout_id, attempt_id, status="succeeded")
            except InvalidTransitionError:
                pass  # already cancelled

        calls = []
        for i in range(0, 40, 4):
            chunk = ids[i : i + 4]
            calls += [cancel(store, chunk), cancel(other, chunk[::-1]), finish(other, chunk[1])]
            named = [claimed[rollout_id].attempt.attempt_id for rollout_id in chunk]
            calls += [store.heartbeat("w1"), other.heartbeat("w1", attempt_ids=named)]
        await asyncio.wait_for(asyncio.gather(*calls), timeout=60)

        statuses = {r.status for r in await store.query_rollouts()}
        assert statuses <= {"cancelled", "succeeded"}
        aborted = [record.getMessage() for record in caplog.records if "aborted" in record.getMessage()]
        assert not aborted, "writers lock rollouts, then attempts, each in id order, so none deadlock"
    finally:
        await other.close()
