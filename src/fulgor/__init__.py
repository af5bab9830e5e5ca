"""fulgor: train existing AI agents from their own rollouts.

``import fulgor`` stays light: it never imports torch, transformers, vllm, ray or an agent
framework; those load lazily inside the components that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from fulgor.version import __version__

if TYPE_CHECKING:
    from fulgor.algorithms import Algorithm
    from fulgor.algorithms.apo import APO
    from fulgor.algorithms.grpo import GRPO
    from fulgor.algorithms.sft import SFT
    from fulgor.training import KubernetesRunners, RayRunners, Trainer

# Loaded on first use, so that `import fulgor` stays small.
_LAZY = {
    "APO": "fulgor.algorithms.apo",
    "Algorithm": "fulgor.algorithms",
    "GRPO": "fulgor.algorithms.grpo",
    "KubernetesRunners": "fulgor.training",
    "SFT": "fulgor.algorithms.sft",
    "RayRunners": "fulgor.training",
    "Trainer": "fulgor.training",
}

__all__ = [
    "APO",
    "GRPO",
    "LLM",
    "SFT",
    "Agent",
    "Algorithm",
    "Attempt",
    "AttemptedRollout",
    "ConfigError",
    "FulgorError",
    "InvalidTransitionError",
    "KubernetesRunners",
    "ModelCall",
    "NotFoundError",
    "PromptTemplate",
    "RayRunners",
    "ResourcesVersion",
    "Reward",
    "Rollout",
    "RolloutConfig",
    "RolloutRequest",
    "Span",
    "StoreError",
    "SubprocessAgent",
    "Trainer",
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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fulgor' has no attribute {name!r}")
