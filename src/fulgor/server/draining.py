"""Draining: held long-polls answer at once when the server starts to shut down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["Draining"]

T = TypeVar("T")


class Draining:
    """Set when the server starts to shut down, so long-polls answer at once instead of holding it up.

    Works across event loops and threads: ``begin`` may be called from a signal handler or another
    thread, and wakes every held request on whichever loop it waits. It takes no lock, so a signal
    landing anywhere in :meth:`hold` cannot deadlock: ``hold`` registers its waiter before it reads
    the flag and ``begin`` sets the flag before it reads the waiters, so one of them always sees
    the other (each step is one atomic operation under the GIL).
    """

    def __init__(self) -> None:
        self._begun = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    def begin(self) -> None:
        self._begun = True
        for loop, future in self._waiters.copy():
            with contextlib.suppress(RuntimeError):  # that loop closed meanwhile: nothing waits there
                loop.call_soon_threadsafe(_resolve, future)

    @property
    def begun(self) -> bool:
        return self._begun

    async def hold(self, work: Awaitable[T], fallback: Callable[[], Awaitable[T]]) -> T:
        """``work``'s result, or ``fallback()``'s when draining begins first (``work`` is cancelled)."""
        loop = asyncio.get_running_loop()
        drained: asyncio.Future[None] = loop.create_future()
        self._waiters.add((loop, drained))
        if self._begun:
            _resolve(drained)
        task = asyncio.ensure_future(work)
        either: set[asyncio.Future[Any]] = {task, drained}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._waiters.discard((loop, drained))
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled():
            return task.result()
        return await fallback()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
