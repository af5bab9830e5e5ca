"""Blocking access to any Store, and building a store from a URL at the CLI/config edge."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import warnings
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from fulgor.errors import ConfigError, ValidationError
from fulgor.store.base import SpanList, Store
from fulgor.store.memory import MemoryStore
from fulgor.store.sqlite import SqliteStore
from fulgor.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    JsonDict,
    Resources,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    Worker,
)

__all__ = ["SyncStore", "open_store"]

T = TypeVar("T")


def open_store(url: str, *, create: bool = True) -> Store:
    """A store from a URL: ``memory://``, ``sqlite:///PATH`` (relative) / ``sqlite:////ABS/PATH``, or
    ``http://HOST:PORT`` / ``https://...`` for a StoreClient of ``fulgor serve`` (token: FULGOR_TOKEN),
    or ``postgresql://USER:PASSWORD@HOST:PORT/DB[?schema=NAME]`` for a PostgresStore.

    With ``create=False`` a SQLite file that does not exist yet is an error instead of a new store
    (for PostgreSQL, a missing schema is, when the store first connects).
    """
    if url.startswith(("http://", "https://")):
        from fulgor.store.client import StoreClient

        return StoreClient(url)
    if url.startswith(("postgresql://", "postgres://")):
        from fulgor.store.postgres import PostgresStore

        return PostgresStore.from_url(url, create=create)
    if url == "memory://":
        return MemoryStore()
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.name:
            raise ConfigError(f"store URL {url!r} names no file; use sqlite:///runs/NAME/store.sqlite")
        if not create and not path.exists():
            raise ConfigError(f"no store at {path}; check the --store URL or the run directory")
        return SqliteStore(path)
    raise ConfigError(
        f"unknown store URL {url!r}; use memory://, sqlite:///PATH, http://HOST:PORT "
        "or postgresql://USER:PASSWORD@HOST:PORT/DB"
    )


class SyncStore:
    """The Store operations as blocking calls, run on a private event loop thread.

    Use it from scripts and notebooks; call :meth:`close` (or use it as a context manager) to
    close the store and stop the thread. Async code awaits :attr:`store` instead: a blocking call
    from a thread whose event loop is running stalls that loop until the call returns (a warning
    says so), and one from the SyncStore's own loop thread would never return, so it is an error.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fulgor-sync-store", daemon=True)
        self._thread.start()
        # Held while a call is handed to the loop and while close() marks the store closed, so no
        # call reaches the loop after close() has cancelled the calls in flight.
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[asyncio.Task[Any]] = set()
        self._warned = False

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            self._check_caller()
            with self._lock:
                if self._closed:
                    raise ValidationError("the SyncStore is closed; create a new one")
                future = asyncio.run_coroutine_threadsafe(self._call(coroutine), self._loop)
        except BaseException:
            coroutine.close()
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise ValidationError(
                "the SyncStore was closed while this call waited; create a new one"
            ) from None

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await coroutine
        finally:
            self._calls.discard(task)

    def _check_caller(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a SyncStore was called from its own event loop thread, where the call can never "
                "finish; in async code await the store itself (`await sync_store.store.stats()`)"
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        if not self._warned:
            self._warned = True
            warnings.warn(
                "a SyncStore call blocks this thread's running event loop until it returns (a "
                "StoreClient served on that loop never answers); in async code await the store "
                "itself (`await sync_store.store.stats()`)",
                RuntimeWarning,
                stacklevel=4,
            )

    def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        return self._run(self.store.enqueue(requests))

    def start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout:
        return self._run(self.store.start_rollout(request, worker_id))

    def claim(self, worker_id: str, limit: int = 1, wait_seconds: float = 0) -> list[AttemptedRollout]:
        return self._run(self.store.claim(worker_id, limit, wait_seconds))

    def get_rollout(self, rollout_id: str) -> Rollout:
        return self._run(self.store.get_rollout(rollout_id))

    def query_rollouts(
        self,
        *,
        status: RolloutStatus | Sequence[RolloutStatus] | None = None,
        group_id: str | None = None,
        mode: RolloutMode | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
    ) -> list[Rollout]:
        return self._run(
            self.store.query_rollouts(
                status=status, group_id=group_id, mode=mode, limit=limit, offset=offset, order=order
            )
        )

    def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        return self._run(self.store.cancel(rollout_ids))

    def start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout:
        return self._run(self.store.start_attempt(rollout_id, worker_id))

    def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | None = None,
        error: str | None = None,
        metadata: JsonDict | None = None,
    ) -> Attempt:
        return self._run(
            self.store.update_attempt(rollout_id, attempt_id, status=status, error=error, metadata=metadata)
        )

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        return self._run(self.store.list_attempts(rollout_id))

    def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        return self._run(self.store.add_spans(spans))

    def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> SpanList:
        return self._run(
            self.store.query_spans(rollout_id, attempt_id, name=name, limit=limit, offset=offset)
        )

    def put_resources(self, resources: Resources, resources_id: str | None = None) -> ResourcesVersion:
        return self._run(self.store.put_resources(resources, resources_id))

    def get_resources(self, resources_id: str | None = None) -> ResourcesVersion | None:
        return self._run(self.store.get_resources(resources_id))

    def heartbeat(
        self, worker_id: str, stats: JsonDict | None = None, attempt_ids: Sequence[str] | None = None
    ) -> Worker:
        return self._run(self.store.heartbeat(worker_id, stats, attempt_ids))

    def list_workers(self) -> list[Worker]:
        return self._run(self.store.list_workers())

    def wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        return self._run(self.store.wait(rollout_ids, timeout_seconds))

    def stats(self) -> StoreStats:
        return self._run(self.store.stats())

    def close(self) -> None:
        """Close the store and stop the loop thread; calls still waiting end with ValidationError.

        Closing twice is harmless.
        """
        self._check_caller()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

    async def _shutdown(self) -> None:
        # The calls in flight first (a claim or wait may be blocked for many seconds), then the
        # store, then whatever the store left running, so the loop stops with no task pending.
        await _cancel_all(self._calls)
        try:
            await self.store.close()
        finally:
            await _cancel_all(asyncio.all_tasks() - {asyncio.current_task()})

    def __enter__(self) -> SyncStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _cancel_all(tasks: set[asyncio.Task[Any]]) -> None:
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
