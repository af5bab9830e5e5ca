"""LoRA: train a low-rank adapter over frozen weights instead of the weights themselves.

``LoraConfig`` is the adapter's shape (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models"): ``rank``, ``alpha`` (the update is scaled by ``alpha / rank``), ``dropout``
and ``target_modules`` (module names, or ``"all-linear"``: every linear layer but the output
head). ``add_adapter`` wraps a model with a fresh adapter (peft), ``load_adapter`` loads a saved one
to train further. Only the adapter's parameters require gradients, so an updater built over the
wrapped model trains nothing else, and ``save_pretrained`` writes only the adapter (a directory
with ``adapter_config.json``), which the local engine merges into the base weights it serves.

A directory with ``adapters.json`` holds one LoRA adapter per agent over one base
(:func:`adapter_set`): each adapter is a directory of its own, trained and served under its own
name. :func:`adapter_base` is the one answer to "which base weights does this adapter go over",
for serving and for training alike.

What it does not know: how the update computes its loss, or where checkpoints go; an adapter merged
into its base weights to serve is :func:`fulgor.weights.loading.load_model`'s. Needs
``fulgor[torch]`` (peft).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fulgor.errors import ConfigError
from fulgor.weights.errors import ModelLoadError

__all__ = [
    "ADAPTERS_FILE",
    "AdapterSet",
    "LoraConfig",
    "adapter_base",
    "adapter_set",
    "add_adapter",
    "load_adapter",
]

ADAPTERS_FILE = "adapters.json"


@dataclass(frozen=True)
class LoraConfig:
    """The shape of the adapter that trains (defaults: rank 8 on every linear layer)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = "all-linear"

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"LoRA rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ConfigError(f"LoRA alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("LoRA target_modules is empty; name the modules to adapt, or 'all-linear'")

    def _targets(self) -> list[str] | str:
        return self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)

    def to_peft(self, base_path: Path) -> Any:
        """peft's LoraConfig for a causal language model loaded from ``base_path``."""
        peft = _require_peft()
        return peft.LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self._targets(),
            task_type="CAUSAL_LM",
            base_model_name_or_path=str(base_path.resolve()),
        )


def _require_peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ImportError("LoRA training needs peft: pip install 'fulgor[torch]'") from exc
    return peft


def add_adapter(
    model: Any, config: LoraConfig, base_path: Path, *, name: str = "default", first: bool = True
) -> Any:
    """``model`` (loaded from ``base_path``) wrapped with a fresh adapter; only the adapter trains.

    The adapter records ``base_path`` as an absolute path: the engine and a resumed run find the
    base weights through it. With ``first=False``, ``model`` is a peft model already and gets one
    more adapter, ``name`` (one per agent over one base).
    """
    peft = _require_peft()
    try:
        if first:
            return peft.get_peft_model(model, config.to_peft(base_path), adapter_name=name)
        model.add_adapter(name, config.to_peft(base_path))
        return model
    except ValueError as exc:  # e.g. a target module the model does not have
        raise ConfigError(
            f"cannot add a LoRA adapter to {base_path}: {exc} (set LoraConfig.target_modules to module "
            "names the model has, or 'all-linear')"
        ) from exc


def adapter_base(adapter_path: Path, base_path: Path | None = None) -> Path:
    """The base model directory a LoRA adapter goes over: ``base_path`` when given, else the local
    directory its ``adapter_config.json`` names (recorded when it was trained), or a ModelLoadError."""
    if base_path is not None:
        return base_path
    try:
        config = json.loads((adapter_path / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {adapter_path / 'adapter_config.json'}: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{adapter_path / 'adapter_config.json'} is not a JSON object")
    base = config.get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise ModelLoadError(
            f"the LoRA adapter at {adapter_path} names base model {base!r}, which is not a local directory; "
            "put the base model back there to train the adapter further, or serve the base model first "
            "and swap the adapter in"
        )
    return Path(base)


@dataclass(frozen=True)
class AdapterSet:
    """What an ``adapters.json`` directory holds: the base model and each adapter's directory, by
    adapter name."""

    base: Path
    adapters: dict[str, Path]


def adapter_set(path: Path) -> AdapterSet | None:
    """The adapters of a directory holding one per agent; None for any other model directory."""
    marker = path / ADAPTERS_FILE
    if not marker.is_file():
        return None
    try:
        saved = json.loads(marker.read_text())
        return AdapterSet(Path(saved["base"]), {name: path / name for name in saved["adapters"]})
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"cannot read {marker}: {error}") from error


def load_adapter(
    model: Any, adapter_dir: Path, config: LoraConfig, *, name: str = "default", first: bool = True
) -> Any:
    """The adapter saved in ``adapter_dir`` over ``model`` (its base), trainable again; with
    ``first=False`` it joins the adapters of ``model``, a peft model already, as ``name``.

    ``config`` must describe the saved adapter: continuing with another rank, alpha or set of
    modules is refused rather than silently ignored (``"all-linear"`` is saved as the modules it
    found, so it matches whatever modules were saved).
    """
    peft = _require_peft()
    saved = json.loads((adapter_dir / "adapter_config.json").read_text())
    saved_targets = saved.get("target_modules")
    saved_targets = sorted(saved_targets) if isinstance(saved_targets, list) else saved_targets
    wanted_targets = None if isinstance(config.target_modules, str) else sorted(config.target_modules)
    if (saved.get("r"), saved.get("lora_alpha")) != (config.rank, config.alpha) or (
        wanted_targets is not None and saved_targets != wanted_targets
    ):
        raise ConfigError(
            f"the LoRA adapter at {adapter_dir} has rank {saved.get('r')}, alpha {saved.get('lora_alpha')} "
            f"and target modules {saved_targets}, but {config} was asked for; continue with the saved "
            "settings or start a new run directory"
        )
    if first:
        return peft.PeftModel.from_pretrained(model, adapter_dir, adapter_name=name, is_trainable=True)
    model.load_adapter(adapter_dir, adapter_name=name, is_trainable=True)
    return model
