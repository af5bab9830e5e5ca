"""Inference engines: fulgor's own transformers engine, and a supervisor for vLLM.

Both return the exact token ids and logprobs they sampled and take new weights without a restart.
A training session drives either (or a server it only calls) through one protocol, :class:`Engine`.
``import fulgor.engine`` stays light: torch, transformers and FastAPI load inside the functions and
modules that need them (``fulgor.engine.app`` needs the ``server`` extra). Models load through
:mod:`fulgor.weights` (``load_model``, ``ModelLoadError``), as the trainer's do.
"""

from __future__ import annotations

from fulgor.engine.base import Engine
from fulgor.engine.errors import (
    AdminAuthError,
    AdminDisabledError,
    ContextLengthError,
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
    UnknownModelError,
    VLLMError,
)
from fulgor.engine.local import EngineConfig, LocalEngine, WeightSwap
from fulgor.engine.models import MODEL_SIZES, init_model
from fulgor.engine.sampling import SamplingParams
from fulgor.engine.vllm import VLLMConfig, VLLMServer

__all__ = [
    "MODEL_SIZES",
    "AdminAuthError",
    "AdminDisabledError",
    "ContextLengthError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineUnavailableError",
    "InvalidRequestError",
    "LocalEngine",
    "SamplingParams",
    "UnknownModelError",
    "VLLMConfig",
    "VLLMError",
    "VLLMServer",
    "WeightSwap",
    "init_model",
]
