"""An event loop on a thread of its own, behind the simulated servers' blocking ``with`` blocks.

What it does not know: which server runs on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable

__all__ = ["LoopThread"]


class LoopThread:
    """Runs ``opening`` on a new event loop on a thread, keeps the loop running until :meth:`stop`,
    then runs ``closing`` on it. An ``opening`` that raises (a taken port) is raised by :meth:`start`,
    and the thread ends."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(
        self, opening: Callable[[], Awaitable[object]], closing: Callable[[], Awaitable[object]]
    ) -> None:
        loop = asyncio.new_event_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                loop.run_until_complete(opening())
            except BaseException as error:
                loop.close()
                started.set_exception(error)
                return
            started.set_result(None)
            loop.run_forever()
            loop.run_until_complete(closing())
            loop.close()

        thread = threading.Thread(target=run, name=self._name, daemon=True)
        thread.start()
        started.result(10)
        self._loop, self._thread = loop, thread

    def stop(self, timeout_seconds: float) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_seconds)
            self._loop = self._thread = None
