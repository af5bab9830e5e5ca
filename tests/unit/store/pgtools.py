"""PostgreSQL for the store tests: the server from FULGOR_TEST_POSTGRES_URL, one schema per test.

Without the variable every PostgreSQL test is skipped; ``eval "$(bash .ci/start-postgres.sh)"``
starts a local server and sets it. Each test directory gets a fresh schema, named in a file in the
directory so that reopening a store on the same directory finds the same data. A schema whose
directory pytest has removed (it keeps the last few runs) is dropped when a new one is made.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fulgor.store.postgres import PostgresStore

URL_VARIABLE = "FULGOR_TEST_POSTGRES_URL"
_SCHEMA_FILE = "postgres-schema"


def postgres_url() -> str:
    """The test server's URL; skips the test when it is not configured."""
    url = os.environ.get(URL_VARIABLE)
    if not url:
        pytest.skip(f'{URL_VARIABLE} is not set; `eval "$(bash .ci/start-postgres.sh)"` sets it')
    return url


def schema_for(directory: Path, url: str) -> str:
    """The schema that belongs to ``directory``, created (empty) on first use."""
    marker = directory / _SCHEMA_FILE
    if marker.exists():
        return marker.read_text()
    import psycopg
    from psycopg import sql

    schema = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(url, autocommit=True) as conn:
        _drop_stale_schemas(conn)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(sql.Identifier(schema), str(directory)))
    marker.write_text(schema)
    return schema


def _drop_stale_schemas(conn: Any) -> None:
    from psycopg import sql

    rows = conn.execute(
        "SELECT nspname, obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname LIKE 'test\\_%'"
    ).fetchall()
    for schema, directory in rows:
        if directory and not Path(directory).exists():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def open_postgres_store(directory: Path, clock: Callable[[], float]) -> PostgresStore:
    """A PostgresStore on the directory's schema, opened."""
    url = postgres_url()
    from fulgor.store.postgres import PostgresStore

    store = PostgresStore(url, schema=schema_for(directory, url), clock=clock)
    await store.open()
    return store
