"""The current rollout, carried in a contextvar, and the recorder that writes its spans.

What the agent emits (rewards, messages, operations) must land under the right rollout and attempt
even when the agent starts asyncio tasks or ``asyncio.to_thread`` calls: both copy contextvars, so
the context follows the work. A thread the agent starts itself (``threading.Thread``,
``ThreadPoolExecutor.submit``) starts with an empty context and so outside the rollout: run its work
with ``contextvars.copy_context().run(...)``, or hand it ``current_context()`` and enter
``use_context`` there. (Falling back to "the one rollout running" would attribute a thread that
outlived its rollout to the next one, and would work with one rollout at a time only.)

The recorder buffers spans from any thread and writes them to the store in batches off the agent's
path; the runner flushes it before it reports the attempt's outcome, so no span is lost when a
rollout ends.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from fulgor.errors import FulgorError, NotFoundError, ValidationError
from fulgor.store.base import Store
from fulgor.types import Span

__all__ = ["AgentError", "RolloutContext", "SpanRecorder", "current_context", "new_span_id", "use_context"]

logger = logging.getLogger(__name__)


class AgentError(FulgorError):
    """An agent-side helper was used wrongly (outside a rollout, with a bad value)."""

    code = "agent_error"


def new_span_id() -> str:
    return secrets.token_hex(8)


# Errors a retry cannot cure: the same batch would be refused again.
_PERMANENT_ERRORS = (ValidationError, NotFoundError)


class SpanRecorder:
    """Collects spans from any thread and writes them to the store in batches.

    ``record`` never blocks and never talks to the store; a flusher task on the runner's event loop
    (``run``) writes whatever has accumulated in one ``add_spans`` call. A batch whose write fails
    (or is cancelled) goes back to the front of the buffer, and a store error that may pass
    (unreachable, busy) is retried with backoff, which is safe because the store ignores a span id
    it already holds. ``flush`` writes the rest and raises the store's error when a write finally
    fails, so the runner can fail the attempt instead of pretending its trace is complete. A batch
    the store refuses as invalid is written span by span instead, so one bad span cannot hold back
    the others: the spans it refuses are dropped, logged and counted in ``refused`` (as are spans
    the OpenTelemetry bridge could not convert, see ``count_refused``).
    """

    def __init__(self, store: Store, *, write_tries: int = 4, retry_delay_seconds: float = 0.1) -> None:
        if write_tries < 1 or retry_delay_seconds < 0:
            raise AgentError("SpanRecorder needs write_tries >= 1 and retry_delay_seconds >= 0")
        self._store = store
        self._write_tries = write_tries
        self._retry_delay_seconds = retry_delay_seconds
        self._pending: list[Span] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.written = 0
        self.refused = 0

    @property
    def pending(self) -> int:
        """How many recorded spans have not reached the store yet."""
        with self._lock:
            return len(self._pending)

    def count_refused(self) -> None:
        """Count a span dropped before it was recorded (from any thread)."""
        with self._lock:
            self.refused += 1

    def record(self, span: Span) -> None:
        with self._lock:
            self._pending.append(span)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def flush(self) -> None:
        """Write every span recorded so far; raise the store's error if a write finally fails."""
        delay = self._retry_delay_seconds
        for tries_left in range(self._write_tries - 1, -1, -1):
            try:
                await self._write_pending()
                return
            except FulgorError as failure:
                if not tries_left:
                    raise
                logger.warning("writing spans failed (%s); retrying in %.2fs", failure, delay)
            await asyncio.sleep(delay)
            delay *= 2

    async def _write_pending(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            await self._store.add_spans(batch)
        except _PERMANENT_ERRORS:
            await self._write_one_by_one(batch)
            return
        except BaseException:
            self._put_back(batch)
            raise
        self.written += len(batch)

    async def _write_one_by_one(self, batch: list[Span]) -> None:
        for index, span in enumerate(batch):
            try:
                await self._store.add_spans([span])
            except _PERMANENT_ERRORS as refusal:
                self.count_refused()
                logger.error(
                    "the store refused span %r (%s) of rollout %s attempt %s; it is dropped: %s",
                    span.name,
                    span.span_id,
                    span.rollout_id,
                    span.attempt_id,
                    refusal,
                )
            except BaseException:
                self._put_back(batch[index:])
                raise
            else:
                self.written += 1

    def _put_back(self, spans: list[Span]) -> None:
        with self._lock:
            self._pending[:0] = spans  # ahead of what was recorded meanwhile, to keep the order

    async def run(self) -> None:
        """Flush whenever spans arrive, until cancelled (the runner's final ``flush`` writes the rest)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        try:
            while True:
                try:
                    await self.flush()  # also whatever was recorded before this task started
                except FulgorError as failure:
                    # The spans stay buffered; the next flush tries again, and the runner's final
                    # one fails the attempt if the store still cannot take them.
                    logger.warning("spans stay buffered after a failed write: %s", failure)
                await self._wake.wait()
                self._wake.clear()
        finally:
            self._loop = None
            self._wake = None


@dataclass(frozen=True)
class RolloutContext:
    """Where the running agent's spans go: its rollout, attempt, trace and recorder."""

    rollout_id: str
    attempt_id: str
    recorder: SpanRecorder
    trace_id: str = field(default_factory=lambda: secrets.token_hex(16))
    agent_name: str | None = None
    parent_span_id: str | None = None


_current: ContextVar[RolloutContext | None] = ContextVar("fulgor_rollout_context", default=None)


def current_context() -> RolloutContext:
    """The rollout the calling code runs in; AgentError when there is none."""
    context = _current.get()
    if context is None:
        raise AgentError(
            "no rollout is running in this context: call emit_* and operation from an agent that a "
            "fulgor runner, Trainer.fit or Trainer.dev is running. A thread the agent starts "
            "(threading.Thread, ThreadPoolExecutor) does not inherit the rollout: submit "
            "contextvars.copy_context().run(func, ...) instead of func, or pass it "
            "fulgor.agent.current_context() and wrap its work in fulgor.agent.use_context(context)"
        )
    return context


@contextmanager
def use_context(context: RolloutContext) -> Iterator[RolloutContext]:
    """Make ``context`` current for the code inside the block, the asyncio tasks and
    ``asyncio.to_thread`` calls it starts, and threads it starts through ``copy_context().run``."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
