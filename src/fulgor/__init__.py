"""fulgor: train existing AI agents from their own rollouts.

``import fulgor`` stays light: it never imports torch, transformers, vllm, ray or an agent
framework; those load lazily inside the components that need them.
"""

from __future__ import annotations

from fulgor.agent import (
    Agent,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    operation,
    rollout,
)
from fulgor.errors import (
    ConfigError,
    FulgorError,
    InvalidTransitionError,
    NotFoundError,
    StoreError,
    ValidationError,
)
from fulgor.runner import SubprocessAgent
from fulgor.types import (
    LLM,
    Attempt,
    AttemptedRollout,
    ModelCall,
    PromptTemplate,
    ResourcesVersion,
    Reward,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    Span,
    Worker,
)

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "Agent",
    "Attempt",
    "AttemptedRollout",
    "ConfigError",
    "FulgorError",
    "InvalidTransitionError",
    "ModelCall",
    "NotFoundError",
    "PromptTemplate",
    "ResourcesVersion",
    "Reward",
    "Rollout",
    "RolloutConfig",
    "RolloutRequest",
    "Span",
    "StoreError",
    "SubprocessAgent",
    "ValidationError",
    "Worker",
    "__version__",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "operation",
    "rollout",
]
