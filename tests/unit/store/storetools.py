"""Shared pieces of the store tests: the backends under test, a fake clock and small builders.

Adding a backend to every store test (the conformance suite and the state machine) is one line in
``BACKENDS``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fulgor.store.base import Store
from fulgor.types import RolloutConfig, RolloutRequest, Span, StoreStats

Clock = Callable[[], float]
StoreFactory = Callable[[Path, Clock], Awaitable[Store]]
MakeStore = Callable[..., Awaitable[Store]]  # the make_store fixture: (clock=time.time) -> Store

START_TIME = 1_700_000_000.0


class FakeClock:
    """A clock the test moves by hand; starts at a fixed, realistic epoch time."""

    def __init__(self, now: float = START_TIME) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def _memory(directory: Path, clock: Clock) -> Store:
    from fulgor.store.memory import MemoryStore

    return MemoryStore(clock=clock)


async def _sqlite(directory: Path, clock: Clock) -> Store:
    from fulgor.store.sqlite import SqliteStore

    return SqliteStore(directory / "store.sqlite", clock=clock)


async def _postgres(directory: Path, clock: Clock) -> Store:
    from pgtools import open_postgres_store

    return await open_postgres_store(directory, clock)


async def _http(directory: Path, clock: Clock) -> Store:
    from servetools import serve_sqlite

    return await serve_sqlite(directory / "store.sqlite", clock)


# name -> async factory(directory, clock). The directory is private to one test (or one
# state-machine run); opening a second store on the same directory must see the first one's data
# for every backend listed in PERSISTENT.
BACKENDS: dict[str, StoreFactory] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": _postgres,
    "http": _http,
}
PERSISTENT: frozenset[str] = frozenset({"sqlite", "postgres", "http"})

_span_numbers = itertools.count(1)


def request(
    input: Any = None,
    *,
    group_id: str | None = None,
    mode: Any = "train",
    metadata: dict[str, Any] | None = None,
    resources_id: str | None = None,
    **config: Any,
) -> RolloutRequest:
    """A RolloutRequest; keyword arguments beyond the request's own go to its RolloutConfig."""
    return RolloutRequest(
        input={"task": "2+2"} if input is None else input,
        mode=mode,
        group_id=group_id,
        resources_id=resources_id,
        metadata=metadata or {},
        config=RolloutConfig(**config),
    )


def span(
    rollout_id: str, attempt_id: str, span_id: str | None = None, name: str = "step", **fields: Any
) -> Span:
    """A minimal valid span; a fresh span id unless one is given."""
    number = next(_span_numbers)
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id="trace-1",
        span_id=span_id or f"span-{number}",
        name=name,
        start_time=fields.pop("start_time", START_TIME),
        **fields,
    )


def counts(stats: StoreStats) -> tuple[dict[str, int], dict[str, int], int, int, int]:
    """Stats as plain values, with zero counts dropped (a backend may or may not list them)."""
    return (
        {status: n for status, n in stats.rollouts.items() if n},
        {status: n for status, n in stats.attempts.items() if n},
        stats.spans,
        stats.workers,
        stats.resources_versions,
    )


async def check_a_new_deadline_wakes_a_waiter(store: Store, waiting: str) -> None:
    """A ``claim`` or ``wait`` goes to sleep while no attempt has a deadline; the attempt that brings
    one starts after it (start_rollout wakes no claim: nothing is queued), so only that deadline can
    wake it, well before the waiter's own 10 s."""
    started = time.monotonic()
    if waiting == "claim":
        waiter = asyncio.ensure_future(store.claim("w2", wait_seconds=10))
        await asyncio.sleep(0.2)
        hung = await store.start_rollout(request(timeout_seconds=0.3, max_attempts=2), "w1")
    else:
        (rollout,) = await store.enqueue([request(timeout_seconds=0.3)])
        waiter = asyncio.ensure_future(store.wait([rollout.rollout_id], timeout_seconds=10))
        await asyncio.sleep(0.2)
        (hung,) = await store.claim("w1")

    woken = await waiter

    assert [r.rollout_id for r in woken] == [hung.rollout_id]
    assert time.monotonic() - started < 3.0
