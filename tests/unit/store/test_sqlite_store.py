"""SqliteStore beyond the conformance suite: waking waiters without its cross-process recheck."""

from __future__ import annotations

from pathlib import Path

import pytest
from storetools import check_a_new_deadline_wakes_a_waiter, request

from fulgor.store.sqlite import SqliteStore


@pytest.mark.parametrize("waiting", ["claim", "wait"])
async def test_a_deadline_that_appears_while_a_call_waits_wakes_it(tmp_path: Path, waiting: str) -> None:
    # The conformance suite's SQLite store rechecks every 0.2 s for other processes' changes, which
    # would hide a missed wake-up; with a long recheck only the new deadline's signal wakes the waiter.
    store = SqliteStore(tmp_path / "store.sqlite", cross_process_seconds=60)
    try:
        await check_a_new_deadline_wakes_a_waiter(store, waiting)
    finally:
        await store.close()


async def test_a_file_another_writer_keeps_locked_is_unavailable_and_changes_nothing(tmp_path: Path) -> None:
    """Past its busy timeout a write is refused as StoreUnavailableError (a 503 the client retries),
    not an unexpected sqlite3 error, and leaves the store as it was."""
    import sqlite3

    from fulgor.errors import StoreUnavailableError

    path = tmp_path / "store.sqlite"
    store = SqliteStore(path, busy_timeout_seconds=0.1)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process in the middle of a long write
        with pytest.raises(StoreUnavailableError, match="locked"):
            await store.enqueue([request()])
        other.execute("ROLLBACK")
        assert (await store.stats()).rollouts == {}
        await store.enqueue([request()])  # the lock is gone: writes go through again
        assert (await store.stats()).rollouts == {"queuing": 1}
    finally:
        other.close()
        await store.close()


def test_a_file_another_process_keeps_locked_while_opening_is_unavailable_not_a_bad_file(
    tmp_path: Path,
) -> None:
    """Opening needs the file's lock too (switching to WAL): past the busy timeout that is a store
    that is busy for now (StoreUnavailableError), not a file that is no store (ConfigError)."""
    import sqlite3

    from fulgor.errors import StoreUnavailableError

    path = tmp_path / "store.sqlite"
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("CREATE TABLE t (x)")
        other.execute("BEGIN EXCLUSIVE")  # another process in the middle of a long write
        with pytest.raises(StoreUnavailableError, match="locked"):
            SqliteStore(path, busy_timeout_seconds=0.1)
    finally:
        other.close()
