"""The trainer's own copy of the model, and the checkpoints it writes under ``run_dir/checkpoints``.

The engine serves one copy of the weights and the trainer updates another (all of it, or a LoRA
adapter over it); after each step the trainer saves its copy (or just the adapter) as
``checkpoints/step-N`` (written to a temporary directory, flushed to disk and renamed, so a
checkpoint that exists is complete, after a crash or a power cut too) and the engine loads it.
Next to the weights, ``training_state.pt`` holds what continuing exactly needs besides them (the
updater's optimiser state and the step). A run restarted on the same run directory continues from
the newest complete checkpoint.

With one LoRA adapter per agent (``GRPO(adapters=...)``) the trainer's copy is one frozen base with
several named adapters; ``step-N`` then holds each adapter in ``step-N/NAME/`` and names them, and
the base they go over, in ``step-N/adapters.json``.

Checkpoints are pruned as training goes (:func:`prune_checkpoints`): the newest few stay, and so
does the one with the best validation accuracy; the others are renamed to a hidden name first and
then removed, so a checkpoint that is half deleted is never taken for one to resume from. Only the
newest keeps its optimiser state (:func:`drop_old_training_state`): a run resumes from the newest,
and an AdamW state is twice the weights, so a run's disk use would otherwise grow with its steps.

Needs ``fulgor[torch]``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.engine.loading import ADAPTERS_FILE, AdapterSet, adapter_set, no_progress_bars
from fulgor.errors import ConfigError

if TYPE_CHECKING:
    from fulgor.algorithms.lora import LoraConfig

__all__ = [
    "ADAPTERS_FILE",
    "OPTIMIZER_DIR",
    "TRAINING_STATE_FILE",
    "AdapterSet",
    "Policy",
    "adapter_set",
    "checkpoint_accuracies",
    "drop_old_training_state",
    "kept_checkpoints",
    "latest_checkpoint",
    "load_policy",
    "load_training_state",
    "prune_checkpoints",
    "set_torch_threads",
    "usable_cores",
]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
_PRUNED_DIR = re.compile(r"^\.step-\d+\.pruned$")
TRAINING_STATE_FILE = "training_state.pt"
OPTIMIZER_DIR = "optimizer"
"""The optimiser's shards, when several ranks saved the checkpoint (:mod:`fulgor.training.distributed`)."""


@dataclass
class Policy:
    """The model the trainer updates, with its tokenizer; ``adapters`` names the LoRA adapters of a
    model with one per agent (over the base model at ``base``). ``write_weights`` writes the model's
    files into a checkpoint directory instead of ``model.save_pretrained`` (a model sharded over
    processes gathers its weights first: :mod:`fulgor.training.distributed`)."""

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
    from fulgor.algorithms.lora import adapter_base, add_adapter, load_adapter
    from fulgor.engine.loading import checkpoint_kind, load_model, resolve_device

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
    from fulgor.algorithms.lora import add_adapter, load_adapter
    from fulgor.engine.loading import checkpoint_kind, load_model

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


def latest_checkpoint(checkpoints: Path) -> tuple[int, Path] | None:
    """The newest complete ``step-N`` checkpoint (full weights or a LoRA adapter), as ``(N, path)``;
    None when there is none."""
    found = _complete_checkpoints(checkpoints)
    if not found:
        return None
    step = max(found)
    return step, found[step]


def _complete_checkpoints(checkpoints: Path) -> dict[int, Path]:
    """Every complete ``step-N`` checkpoint, by N (a ``.step-N.partial`` being written is not one)."""
    found: dict[int, Path] = {}
    if checkpoints.is_dir():
        for entry in checkpoints.iterdir():
            match = _STEP_DIR.match(entry.name)
            markers = ("config.json", "adapter_config.json", ADAPTERS_FILE)
            if match and any((entry / name).is_file() for name in markers):
                found[int(match.group(1))] = entry
    return found


def checkpoint_accuracies(history: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """The validation accuracy of each checkpoint, from a run's metrics (``metrics.jsonl`` lines).

    Validation at step N runs on the weights of ``step-N`` (they are published before it), so a
    line's ``val_accuracy`` belongs to its step's checkpoint; step 0's measures the model the run
    started from, which is no checkpoint, and a ``null`` accuracy (a NaN) is left out.
    """
    return {
        int(metrics["step"]): float(metrics["val_accuracy"])
        for metrics in history
        if metrics.get("step", 0) > 0 and isinstance(metrics.get("val_accuracy"), int | float)
    }


def kept_checkpoints(steps: Iterable[int], keep: int, val_accuracy: Mapping[int, float]) -> set[int]:
    """The checkpoint steps pruning keeps: the newest ``keep`` (``keep`` >= 1; 0 keeps them all) and
    the one of ``steps`` with the highest ``val_accuracy``.

    On a tie the earliest step stays the best: a later one that only equals it replaces nothing, as
    an improvement has to be strict to count in early stopping. Steps without an accuracy are kept
    only while they are among the newest; a run that never validated keeps just the newest ``keep``.
    """
    ordered = sorted(steps)
    if keep == 0:
        return set(ordered)
    kept = set(ordered[-keep:])
    validated = [step for step in ordered if step in val_accuracy]
    if validated:
        kept.add(max(validated, key=lambda step: (val_accuracy[step], -step)))
    return kept


def prune_checkpoints(checkpoints: Path, keep: int, val_accuracy: Mapping[int, float]) -> list[int]:
    """Delete the complete checkpoints :func:`kept_checkpoints` does not keep; returns their steps.

    Each is renamed to a hidden ``.step-N.pruned`` first (one atomic step, flushed to disk before
    anything in it is removed), so :func:`latest_checkpoint` never finds a half-deleted checkpoint,
    after a crash or a power cut either; what an earlier prune left half removed goes first. A
    ``.step-N.partial`` being written is never touched. A deletion that fails is logged and skipped;
    only a ``checkpoints`` folder that cannot be listed raises (OSError).
    """
    for entry in checkpoints.iterdir():
        if _PRUNED_DIR.match(entry.name):
            _remove_tree(entry)
    found = _complete_checkpoints(checkpoints)
    kept = kept_checkpoints(found, keep, val_accuracy)
    return [step for step in sorted(found.keys() - kept) if _delete(found[step])]


def drop_old_training_state(checkpoints: Path) -> list[int]:
    """Remove the training state (``training_state.pt``, the optimiser's shards) of every complete
    checkpoint but the newest, whose state a resumed run continues from; returns their steps. Their
    weights stay: they serve, evaluate and warm-start as before. A removal that fails is logged."""
    found = _complete_checkpoints(checkpoints)
    dropped = []
    for step in sorted(found)[:-1]:
        state, shards = found[step] / TRAINING_STATE_FILE, found[step] / OPTIMIZER_DIR
        if not state.exists() and not shards.exists():
            continue
        try:
            state.unlink(missing_ok=True)
            if shards.exists():
                shutil.rmtree(shards)
        except OSError as error:
            logger.warning("could not remove the training state of %s: %s", found[step], error)
            continue
        dropped.append(step)
    return dropped


def _delete(checkpoint: Path) -> bool:
    """Rename ``checkpoint`` out of sight, then remove it; False (and a warning) when it stays."""
    hidden = checkpoint.with_name(f".{checkpoint.name}.pruned")
    try:
        checkpoint.rename(hidden)
    except OSError as error:
        logger.warning("could not delete the checkpoint %s: %s", checkpoint, error)
        return False
    _remove_tree(hidden)
    return True


def _remove_tree(hidden: Path) -> None:
    """Remove a renamed checkpoint; a failure is logged, and the next prune tries again."""
    try:
        _fsync(hidden.parent)  # the rename is on disk before any file in it is removed
        shutil.rmtree(hidden)
    except OSError as error:
        logger.warning("could not remove %s (the next prune tries again): %s", hidden, error)


def set_torch_threads(threads: int | None) -> int:
    """Use ``threads`` torch threads (default: every core this process may run on, shared among the
    ranks torchrun started on this machine, ``LOCAL_WORLD_SIZE``); returns it."""
    import torch

    count = threads or max(1, usable_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(count)
    return count


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):  # the cores this process may run on (containers, taskset)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
