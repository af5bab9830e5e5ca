"""A store served over HTTP for tests: a real uvicorn server on loopback, on its own thread.

``serve_sqlite`` puts a SqliteStore (on the test's clock) behind ``fulgor.server`` and
returns a StoreClient for it; closing the client also stops the server and closes the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fulgor.server import BackgroundServer, ServerConfig, create_app
from fulgor.store.client import StoreClient
from fulgor.store.sqlite import SqliteStore


class ServedStore(StoreClient):
    """A StoreClient that owns the server it talks to."""

    def __init__(self, server: BackgroundServer, token: str | None = None) -> None:
        super().__init__(server.url, token=token, max_retries=2)
        self.server = server

    async def close(self) -> None:
        await super().close()
        await self.server.astop()


async def serve_sqlite(path: Path, clock: Callable[[], float], **config: Any) -> ServedStore:
    store = SqliteStore(path, clock=clock)
    server = BackgroundServer(create_app(ServerConfig(store=store, **config)))
    await asyncio.to_thread(server.start)
    return ServedStore(server, config.get("token"))
