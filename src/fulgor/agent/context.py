"""The current rollout, carried in a contextvar, and the recorder that writes its spans.

What the agent emits (rewards, messages, operations) must land under the right rollout and attempt
even when the agent starts threads or asyncio tasks: both copy contextvars, so the context follows
the work. The recorder buffers spans from any thread and writes them to the store in batches off
the agent's path; the runner flushes it before it reports the attempt's outcome, so no span is
lost when a rollout ends.
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

from fulgor.errors import FulgorError
from fulgor.store.base import Store
from fulgor.types import Span

__all__ = ["AgentError", "RolloutContext", "SpanRecorder", "current_context", "new_span_id", "use_context"]

logger = logging.getLogger(__name__)


class AgentError(FulgorError):
    """An agent-side helper was used wrongly (outside a rollout, with a bad value)."""

    code = "agent_error"


def new_span_id() -> str:
    return secrets.token_hex(8)


class SpanRecorder:
    """Collects spans from any thread and writes them to the store in batches.

    ``record`` never blocks and never talks to the store; a flusher task on the runner's event loop
    (``run``) writes whatever has accumulated in one ``add_spans`` call. ``flush`` writes the rest
    and raises if the store refused a batch, so the runner can fail the attempt instead of
    pretending its trace is complete.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: list[Span] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.written = 0

    def record(self, span: Span) -> None:
        with self._lock:
            self._pending.append(span)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def flush(self) -> None:
        """Write every span recorded so far."""
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            await self._store.add_spans(batch)
            self.written += len(batch)

    async def run(self) -> None:
        """Flush whenever spans arrive, until cancelled; then flush what is left."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        try:
            while True:
                await self.flush()  # also whatever was recorded before this task started
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
            "fulgor runner, Trainer.fit or Trainer.dev is running"
        )
    return context


@contextmanager
def use_context(context: RolloutContext) -> Iterator[RolloutContext]:
    """Make ``context`` current for the code inside the block (and threads/tasks it starts)."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
