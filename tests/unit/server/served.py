"""A store served over HTTP behind an operator key, for the server's route tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.unit.store.storetools import request

from fulgor.server import BackgroundServer, ServerConfig, create_app
from fulgor.store import SyncStore
from fulgor.store.client import StoreClient
from fulgor.store.sqlite import SqliteStore
from fulgor.types import AttemptedRollout

TOKEN = "operator-key"


@contextmanager
def served_store(tmp_path: Path) -> Iterator[tuple[str, SyncStore]]:
    """The server's URL and a client of its store, on an SQLite file in ``tmp_path``."""
    config = ServerConfig(store=SqliteStore(tmp_path / "s.sqlite"), token=TOKEN)
    with (
        BackgroundServer(create_app(config)) as server,
        SyncStore(StoreClient(server.url, token=TOKEN)) as store,
    ):
        yield server.url, store


def claimed(store: SyncStore) -> AttemptedRollout:
    """A rollout enqueued and claimed by worker ``w1``."""
    store.enqueue([request()])
    (attempted,) = store.claim("w1")
    return attempted
