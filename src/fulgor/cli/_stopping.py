"""How a long-running command learns that it should stop, and never misses it.

Three things ask a command to stop: SIGINT (Ctrl+C), SIGTERM, and its parent going away.
:class:`StopRequests` handles SIGINT and SIGTERM whatever disposition the process inherited (a
background job of a non-interactive shell starts with SIGINT ignored, so Python never installs its
own handler) and, given ``--parent-fd FD`` (the read end of a pipe whose write end only the parent
holds), turns the pipe's end-of-file into the same request: the kernel closes the write end
however the parent ends, SIGKILL included.

A command that stops in order on KeyboardInterrupt (``fulgor train``, where each Ctrl+C cancels
once more) takes :func:`interrupts` instead: SIGINT and SIGTERM each raise KeyboardInterrupt.

Before :meth:`StopRequests.serving` a request interrupts what the main thread is doing (loading a
model) as KeyboardInterrupt; after it, a request only sets :attr:`StopRequests.requested`, and the
command stops its parts in order instead of having an exception land inside one of them (a
KeyboardInterrupt raised inside ``Thread.join`` can leave that thread running unseen, and the
process then exits under a thread that torch is still computing on, which aborts it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType

__all__ = ["StopRequests", "interrupts"]

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    """SIGINT, SIGTERM and the parent's end as one event; a context manager that restores handlers."""

    def __init__(self, parent_fd: int | None = None) -> None:
        self.requested = threading.Event()
        self._parent_fd = parent_fd
        self._serving = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in _SIGNALS}
        if self._parent_fd is not None:
            watcher = threading.Thread(target=self._watch_parent, name="fulgor-parent-watch", daemon=True)
            watcher.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:  # None: a handler not installed from Python, which cannot be restored
                signal.signal(sig, handler)  # type: ignore[arg-type]

    def serving(self) -> None:
        """From now on a request sets :attr:`requested` instead of raising KeyboardInterrupt."""
        self._serving = True

    def wait(self, running: Callable[[], bool]) -> bool:
        """Block until a stop is requested (True) or ``running()`` turns false (False)."""
        while not self.requested.wait(0.25):
            if not running():
                return False
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested.is_set():  # one request is enough: the second never interrupts the stop
            logger.info("%s: already stopping", signal.Signals(signum).name)
            return
        logger.info("%s: stopping", signal.Signals(signum).name)
        self.requested.set()
        if not self._serving:
            raise KeyboardInterrupt

    def _watch_parent(self) -> None:
        assert self._parent_fd is not None
        with contextlib.suppress(OSError):
            while os.read(self._parent_fd, 4096):
                pass
        if not self.requested.is_set():
            logger.warning("the parent process is gone; stopping")
            # Through the signal handler, on the main thread: it interrupts a model still loading.
            os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt on the main thread, each time one comes, whatever
    disposition the process inherited; the previous handlers come back after. Off the main thread
    (where no handler can be installed) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _interrupt) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    logger.info("%s: stopping", signal.Signals(signum).name)
    raise KeyboardInterrupt
