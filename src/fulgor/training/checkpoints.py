"""The trainer's own copy of the model, and the checkpoints it writes under ``run_dir/checkpoints``.

The engine serves one copy of the weights and the trainer updates another (all of it, or a LoRA
adapter over it); after each step the trainer saves its copy (or just the adapter) as
``checkpoints/step-N`` (written to a temporary directory, flushed to disk and renamed, so a
checkpoint that exists is complete, after a crash or a power cut too) and the engine loads it.
Next to the weights, ``training_state.pt`` holds what continuing exactly needs besides them (the
updater's optimiser state and the step). A run restarted on the same run directory continues from
the newest complete checkpoint.

Needs ``fulgor[torch]``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.errors import ConfigError

if TYPE_CHECKING:
    from fulgor.algorithms.lora import LoraConfig

__all__ = [
    "TRAINING_STATE_FILE",
    "Policy",
    "latest_checkpoint",
    "load_policy",
    "load_training_state",
    "set_torch_threads",
]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
TRAINING_STATE_FILE = "training_state.pt"


@dataclass
class Policy:
    """The model the trainer updates, with its tokenizer."""

    model: Any
    tokenizer: Any

    def save(self, checkpoints: Path, step: int, training_state: dict[str, Any] | None = None) -> Path:
        """Save as ``checkpoints/step-{step}`` (complete or absent, never half written), with
        ``training_state`` (tensors, numbers, strings) in its ``training_state.pt``."""
        import torch

        final = checkpoints / f"step-{step}"
        partial = checkpoints / f".step-{step}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            self.model.save_pretrained(partial)
            self.tokenizer.save_pretrained(partial)
            if training_state is not None:
                torch.save({"step": step, **training_state}, partial / TRAINING_STATE_FILE)
            # The files reach the disk before the rename makes them the newest checkpoint: a power
            # cut must not leave a step-N whose files are empty.
            _fsync_tree(partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)  # a model-sized leftover otherwise
            raise
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        _fsync(checkpoints)  # the rename itself
        return final


def _fsync_tree(directory: Path) -> None:
    """Flush every file under ``directory``, then the directories themselves, to disk."""
    for root, _dirs, files in os.walk(directory):
        for name in files:
            _fsync(Path(root) / name)
        _fsync(Path(root))


def _fsync(path: Path) -> None:
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


def load_policy(path: Path, device: str, lora: LoraConfig | None = None) -> Policy:
    """Load a model directory for training (float32, gradients on) on ``device``.

    With ``lora`` only an adapter trains: full weights get a fresh one, and a LoRA checkpoint (an
    adapter directory) is loaded over the base weights it names, to train further.
    """
    from fulgor.algorithms.lora import adapter_base, add_adapter, load_adapter
    from fulgor.engine.loading import checkpoint_kind, load_model, resolve_device

    resolved = resolve_device(device)
    if checkpoint_kind(path) == "lora":
        if lora is None:
            raise ConfigError(f"{path} is a LoRA adapter: train it with GRPO(lora=LoraConfig(...))")
        base = load_model(adapter_base(path), device=resolved, dtype="float32")
        return Policy(load_adapter(base.model, path, lora), base.tokenizer)
    loaded = load_model(path, device=resolved, dtype="float32")
    model = loaded.model if lora is None else add_adapter(loaded.model, lora, path)
    return Policy(model, loaded.tokenizer)


def load_training_state(checkpoint: Path) -> dict[str, Any] | None:
    """The training state saved with ``checkpoint``, on the CPU (an optimiser moves its state to its
    parameters' device when it loads it); None when the checkpoint has none."""
    import torch

    path = checkpoint / TRAINING_STATE_FILE
    if not path.is_file():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def latest_checkpoint(checkpoints: Path) -> tuple[int, Path] | None:
    """The newest complete ``step-N`` checkpoint (full weights or a LoRA adapter), as ``(N, path)``;
    None when there is none."""
    found: list[tuple[int, Path]] = []
    if checkpoints.is_dir():
        for entry in checkpoints.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and any((entry / name).is_file() for name in ("config.json", "adapter_config.json")):
                found.append((int(match.group(1)), entry))
    return max(found) if found else None


def set_torch_threads(threads: int | None) -> int:
    """Use ``threads`` torch threads (default: every core this process may run on); returns it."""
    import torch

    count = threads or _usable_cores()
    torch.set_num_threads(count)
    return count


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # the cores this process may run on (containers, taskset)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
