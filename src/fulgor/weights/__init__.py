"""Weights on disk and in memory: loading a model directory, LoRA adapters, importing a model, and
the trainable copy of a model saved as checkpoints.

One room below both the engine (which serves weights) and training (which updates them), so that
both load, merge and save weights the same way:

- :mod:`fulgor.weights.loading`: a model directory (full weights, or a LoRA adapter merged into its
  base) loaded for inference, with what serving it needs to know (:class:`LoadedModel`), and the
  lazy torch and transformers imports, device and dtype choices that go with it.
- :mod:`fulgor.weights.lora`: :class:`LoraConfig`, adding or loading a trainable adapter, the base an
  adapter goes over, and directories of one adapter per agent (``adapters.json``).
- :mod:`fulgor.weights.importing`: a GGUF file or a Hugging Face directory made a model directory
  (``fulgor model import``), and a directory's facts read from its files (``fulgor doctor``).
- :mod:`fulgor.weights.policy`: :class:`Policy`, the trainer's copy of a model, loaded for training
  and saved as one checkpoint directory, complete or absent, with its training state.
- :mod:`fulgor.weights.errors`: :class:`ModelLoadError`.

It knows nothing of engines, runs or algorithms. ``import fulgor.weights`` stays light: torch,
transformers and peft load inside the functions that need them.
"""

from __future__ import annotations

from fulgor.weights.errors import ModelLoadError
from fulgor.weights.importing import ModelFacts, describe_model, import_model
from fulgor.weights.loading import LoadedModel, load_model
from fulgor.weights.lora import LoraConfig
from fulgor.weights.policy import Policy, load_policy

__all__ = [
    "LoadedModel",
    "LoraConfig",
    "ModelFacts",
    "ModelLoadError",
    "Policy",
    "describe_model",
    "import_model",
    "load_model",
    "load_policy",
]
