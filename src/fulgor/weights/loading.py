"""Loading Hugging Face model directories: full weights, or a LoRA adapter merged into full weights.

Every local model goes through here, whether fulgor built it (:mod:`fulgor.engine.models`) or a user
downloaded it, and whether the engine serves it or the trainer updates it
(:mod:`fulgor.weights.policy`), so no caller has a special path for its own models. A
:class:`LoadedModel` carries what serving it needs to know besides the weights (its context length,
the ids that end a generation, how its forward takes a cache). Also here: the lazy imports of torch
and transformers (a missing one raises an ImportError that names the ``fulgor[torch]`` extra), the
device and dtype a run asks for, and transformers' progress bars kept quiet.

What it does not know: how an adapter trains (:mod:`fulgor.weights.lora`), how a model is served or
swapped (:mod:`fulgor.engine`), or where checkpoints go.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from fulgor.weights.errors import ModelLoadError
from fulgor.weights.lora import adapter_base

__all__ = [
    "CONTEXT_LENGTH_KEYS",
    "CheckpointKind",
    "LoadedModel",
    "checkpoint_kind",
    "eos_token_ids",
    "load_model",
    "no_progress_bars",
    "require_torch",
    "require_transformers",
    "resolve_device",
    "resolve_dtype",
]

logger = logging.getLogger(__name__)

CheckpointKind = Literal["full", "lora"]


def require_torch() -> ModuleType:
    """Import torch and transformers, or say which extra installs them."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the local engine needs torch and transformers: pip install 'fulgor[torch]'"
        ) from exc
    return torch


def require_transformers() -> Any:
    """The transformers module (typed loosely: its classes are untyped for strict checkers)."""
    require_torch()
    import transformers

    return transformers


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off while weights load or save: a trainer does both at every
    step, and a bar each time would bury its console and logs."""
    progress = require_transformers().utils.logging
    enabled = progress.is_progress_bar_enabled()
    progress.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            progress.enable_progress_bar()


def resolve_device(device: str) -> str:
    """``auto`` means CUDA when a GPU is visible, else CPU."""
    torch = require_torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for but no CUDA GPU is visible; use --device cpu")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    """``auto`` means float32 on CPU (exact logprobs) and bfloat16 on GPU."""
    torch = require_torch()
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if dtype not in names:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose auto, {', '.join(names)}")
    return names[dtype]


def checkpoint_kind(path: Path) -> CheckpointKind:
    """A directory with ``adapter_config.json`` is a LoRA adapter; one with ``config.json`` full weights."""
    if (path / "adapter_config.json").is_file():
        return "lora"
    if (path / "config.json").is_file():
        return "full"
    raise ModelLoadError(
        f"no model at {path}: expected a Hugging Face directory with config.json (full weights) or "
        "adapter_config.json (a LoRA adapter); build one with `fulgor model init --out DIR`"
    )


@dataclass
class LoadedModel:
    """A model ready for inference and what the engine needs to know about it."""

    model: Any
    tokenizer: Any
    path: Path
    kind: CheckpointKind
    device: str
    max_model_len: int
    eos_token_ids: frozenset[int]
    pad_token_id: int
    cache_argument: str = field(default="cache")
    logits_to_keep: bool = True
    base_path: Path | None = None


CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""The config fields that hold a model's context length, in the order they are read."""


def _max_model_len(config: Any, tokenizer: Any) -> int:
    for name in CONTEXT_LENGTH_KEYS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < 10**8:
        return length
    raise ModelLoadError("cannot tell the model's context length from its config; pass --max-model-len")


def _as_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a generation: the model config's, its generation config's and the
    tokenizer's end-of-sequence ids (what the engine stops on)."""
    ids = _as_ids(getattr(model.config, "eos_token_id", None))
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        ids |= _as_ids(getattr(generation_config, "eos_token_id", None))
    ids |= _as_ids(tokenizer.eos_token_id)
    return frozenset(ids)


def _cache_argument(model: Any) -> str:
    # transformers 5 renamed ``past_key_values`` to ``cache``; older releases only know the former.
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _load_weights(path: Path, device: str, dtype: Any) -> Any:
    transformers = require_transformers()
    try:
        with no_progress_bars():
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model weights from {path}: {exc}") from exc
    return model.to(device).eval()


def _merge_adapter(model: Any, adapter_path: Path) -> Any:
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise ImportError("LoRA adapters need peft: pip install 'fulgor[torch]'") from exc
    try:
        with no_progress_bars():
            merged = PeftModel.from_pretrained(model, adapter_path).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot apply the LoRA adapter at {adapter_path}: {exc}") from exc
    return merged.eval()


def load_model(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    base_path: str | Path | None = None,
    max_model_len: int | None = None,
) -> LoadedModel:
    """Load a model directory (full weights) or a LoRA adapter merged into ``base_path``'s weights."""
    require_torch()
    from transformers import AutoTokenizer

    source = Path(path)
    kind = checkpoint_kind(source)
    resolved_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, resolved_device)
    weights_path = adapter_base(source, Path(base_path) if base_path else None) if kind == "lora" else source
    model = _load_weights(weights_path, resolved_device, torch_dtype)
    if kind == "lora":
        model = _merge_adapter(model, source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(weights_path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer from {weights_path}: {exc}") from exc
    limit = _max_model_len(model.config, tokenizer)
    if max_model_len is not None:
        if max_model_len > limit:
            raise ModelLoadError(
                f"--max-model-len {max_model_len} exceeds the model's context length {limit}"
            )
        limit = max_model_len
    eos = eos_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    logger.info("loaded %s weights from %s on %s (%s)", kind, source, resolved_device, torch_dtype)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=source,
        kind=kind,
        device=resolved_device,
        max_model_len=limit,
        eos_token_ids=eos,
        pad_token_id=int(pad),
        cache_argument=_cache_argument(model),
        logits_to_keep="logits_to_keep" in inspect.signature(model.forward).parameters,
        base_path=weights_path,
    )
