"""The current rollout, carried in a contextvar, and the recorder that writes its spans.

What the agent emits (rewards, messages, operations) must land under the right rollout and attempt
even when the agent starts asyncio tasks or ``asyncio.to_thread`` calls: both copy contextvars, so
the context follows the work. A thread the agent starts itself (``threading.Thread``,
``ThreadPoolExecutor.submit``) starts with an empty context and so outside the rollout: run its work
with ``contextvars.copy_context().run(...)``, or hand it ``current_context()`` and enter
``use_context`` there. (Falling back to "the one rollout running" would attribute a thread that
outlived its rollout to the next one, and would work with one rollout at a time only.)

The rollout's :class:`~fulgor.store.writer.SpanWriter` takes spans from any thread and writes them
to the store in batches off the agent's path; the runner closes it (everything written, or counted
as lost) before it reports the attempt's outcome, so no span is left behind when a rollout ends.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from fulgor.errors import FulgorError
from fulgor.semconv import SPAN_MODEL_CALL
from fulgor.store.writer import SpanWriter, WriterClosedError
from fulgor.types import Span

__all__ = ["AgentError", "RolloutContext", "current_context", "new_span_id", "use_context"]

logger = logging.getLogger(__name__)


class AgentError(FulgorError):
    """An agent-side helper was used wrongly (outside a rollout, with a bad value)."""

    code = "agent_error"


def new_span_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class RolloutContext:
    """Where the running agent's spans go: its rollout, attempt, trace and span writer."""

    rollout_id: str
    attempt_id: str
    writer: SpanWriter
    trace_id: str = field(default_factory=lambda: secrets.token_hex(16))
    agent_name: str | None = None
    parent_span_id: str | None = None
    names_agent_calls: bool = False
    """The rollout's ``llm`` serves agents with models of their own (``LLM.agent_models``): calls
    must name their agent when they are made (see :mod:`fulgor.agent.langgraph`)."""

    def record(self, span: Span) -> None:
        """Hand ``span`` to the rollout's writer (from any thread; it never blocks). AgentError for
        a ``fulgor.model_call`` span (those come from the gateway alone) and once the attempt has
        ended (its writer is closed: nothing recorded then would reach the store)."""
        if span.name == SPAN_MODEL_CALL:
            raise AgentError(f"{SPAN_MODEL_CALL} spans come from the gateway alone; an agent records none")
        try:
            self.writer.add([span])
        except WriterClosedError:
            raise AgentError(
                f"the attempt {self.attempt_id} of rollout {self.rollout_id} has ended: a span emitted "
                "after it is not recorded (a task or thread of the agent outlived its rollout)"
            ) from None

    def count_lost(self) -> None:
        """Count a span of this rollout that was lost before it could be recorded."""
        self.writer.count_lost(self.rollout_id)


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
