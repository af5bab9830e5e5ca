"""The trainable copy of a model (:class:`Policy`): loading it for training, and saving it as one
checkpoint directory that is complete or absent.

:func:`load_policy` loads a model directory for training (float32, gradients on): all of it, or a
LoRA adapter over frozen base weights (a fresh one, or a saved one to train further), or one adapter
per agent over one base. :meth:`Policy.save` writes ``checkpoints/step-N`` to a temporary
directory, flushes it to disk and renames it into place, so a checkpoint that exists is complete,
after a crash or a power cut too. Next to the weights, ``training_state.pt`` holds what continuing
exactly needs besides them (an updater's optimiser state and the step; :func:`load_training_state`
reads it back). With one adapter per agent, ``step-N`` holds each adapter in ``step-N/NAME/`` and
names them, and the base they go over, in ``step-N/adapters.json``.

What it does not know: which checkpoints a run keeps, resumes from or prunes, and what the training
state holds (:mod:`fulgor.training.checkpoints` and the updaters decide both). Needs
``fulgor[torch]``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fulgor.errors import ConfigError
from fulgor.weights.loading import checkpoint_kind, load_model, no_progress_bars, resolve_device
from fulgor.weights.lora import (
    ADAPTERS_FILE,
    AdapterSet,
    LoraConfig,
    adapter_base,
    adapter_set,
    add_adapter,
    load_adapter,
)

__all__ = [
    "TRAINING_STATE_FILE",
    "Policy",
    "fsync_path",
    "fsync_tree",
    "load_policy",
    "load_training_state",
]

TRAINING_STATE_FILE = "training_state.pt"


@dataclass
class Policy:
    """The model the trainer updates, with its tokenizer; ``adapters`` names the LoRA adapters of a
    model with one per agent (over the base model at ``base``). ``write_weights`` writes the model's
    files into a checkpoint directory instead of ``model.save_pretrained`` (a model sharded over
    processes gathers its weights first, as :mod:`fulgor.training.distributed` does)."""

    model: Any
    tokenizer: Any
    adapters: tuple[str, ...] = ()
    base: Path | None = None
    write_weights: Callable[[Path], None] | None = None

    def save(self, checkpoints: Path, step: int, training_state: dict[str, Any] | None = None) -> Path:
        """Save as ``checkpoints/step-{step}`` (complete or absent, never half written), with
        ``training_state`` (tensors, numbers, strings) in its ``training_state.pt``."""
        import torch

        final = checkpoints / f"step-{step}"
        partial = checkpoints / f".step-{step}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            # Several adapters: one folder each, by name.
            with no_progress_bars():
                (self.write_weights or self.model.save_pretrained)(partial)
            self.tokenizer.save_pretrained(partial)
            if self.adapters:
                assert self.base is not None
                marker = {"base": str(self.base.resolve()), "adapters": list(self.adapters)}
                (partial / ADAPTERS_FILE).write_text(json.dumps(marker, indent=2) + "\n")
            if training_state is not None:
                torch.save({"step": step, **training_state}, partial / TRAINING_STATE_FILE)
            # The files reach the disk before the rename makes them the newest checkpoint: a power
            # cut must not leave a step-N whose files are empty.
            fsync_tree(partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)  # a model-sized leftover otherwise
            raise
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        fsync_path(checkpoints)  # the rename itself
        return final


def fsync_tree(directory: Path) -> None:
    """Flush every file under ``directory``, then the directories themselves, to disk."""
    for root, _dirs, files in os.walk(directory):
        for name in files:
            fsync_path(Path(root) / name)
        fsync_path(Path(root))


def fsync_path(path: Path) -> None:
    """Flush ``path`` to disk. A directory whose file system cannot flush directories (some network
    and FUSE file systems; Windows cannot open one) is left as it is, as PostgreSQL does."""
    is_dir = path.is_dir()
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except PermissionError:
        if is_dir:
            return
        raise
    try:
        os.fsync(descriptor)
    except OSError as error:
        if not (is_dir and error.errno in (errno.EINVAL, errno.EBADF)):
            raise
    finally:
        os.close(descriptor)


def load_policy(
    path: Path,
    device: str,
    lora: LoraConfig | None = None,
    adapters: Mapping[str, LoraConfig] | None = None,
) -> Policy:
    """Load a model directory for training (float32, gradients on) on ``device``.

    With ``lora`` only an adapter trains: full weights get a fresh one, and a LoRA checkpoint (an
    adapter directory) is loaded over the base weights it names, to train further. With
    ``adapters`` (a name and shape per adapter) one frozen base carries one adapter per name:
    fresh over full weights, or those a checkpoint of them holds.
    """
    resolved = resolve_device(device)
    saved = adapter_set(path)
    if adapters:
        return _load_adapters(path, saved, resolved, adapters)
    if saved is not None:
        raise ConfigError(
            f"{path} holds one LoRA adapter per agent ({', '.join(saved.adapters)}): train it with "
            "GRPO(adapters={...}) naming the same adapters"
        )
    if checkpoint_kind(path) == "lora":
        if lora is None:
            raise ConfigError(
                f"{path} is a LoRA adapter: train it with an algorithm that trains an adapter, "
                "e.g. GRPO(lora=LoraConfig(...))"
            )
        base = load_model(adapter_base(path), device=resolved, dtype="float32")
        return Policy(load_adapter(base.model, path, lora), base.tokenizer)
    loaded = load_model(path, device=resolved, dtype="float32")
    model = loaded.model if lora is None else add_adapter(loaded.model, lora, path)
    return Policy(model, loaded.tokenizer)


def _load_adapters(
    path: Path, saved: AdapterSet | None, device: str, adapters: Mapping[str, LoraConfig]
) -> Policy:
    names = list(adapters)
    if saved is None and checkpoint_kind(path) == "lora":
        raise ConfigError(
            f"{path} is one LoRA adapter; one adapter per agent starts from full weights or from a "
            "checkpoint of such adapters"
        )
    if saved is not None and sorted(saved.adapters) != sorted(names):
        raise ConfigError(
            f"{path} holds the adapters {sorted(saved.adapters)}, but {sorted(names)} were asked for; "
            "continue with the same adapters or start a new run directory"
        )
    base_path = path if saved is None else saved.base
    loaded = load_model(base_path, device=device, dtype="float32")
    model = loaded.model
    for index, name in enumerate(names):
        if saved is None:
            model = add_adapter(model, adapters[name], base_path, name=name, first=index == 0)
        else:
            model = load_adapter(model, saved.adapters[name], adapters[name], name=name, first=index == 0)
    return Policy(model, loaded.tokenizer, tuple(names), base_path)


def load_training_state(checkpoint: Path) -> dict[str, Any] | None:
    """The training state saved with ``checkpoint``, on the CPU (an optimiser moves its state to its
    parameters' device when it loads it); None when the checkpoint has none."""
    import torch

    path = checkpoint / TRAINING_STATE_FILE
    if not path.is_file():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state
