"""The agent side: ``@rollout``/``Agent``, the per-rollout context and the emit helpers."""

from __future__ import annotations

from fulgor.agent.base import Agent, RolloutFunction, Runnable, rollout
from fulgor.agent.context import AgentError, RolloutContext, current_context, use_context
from fulgor.agent.emit import (
    OperationHandle,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    operation,
)

__all__ = [
    "Agent",
    "AgentError",
    "OperationHandle",
    "RolloutContext",
    "RolloutFunction",
    "Runnable",
    "current_context",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "operation",
    "rollout",
    "use_context",
]
