"""The checkpoints a run keeps under ``run_dir/checkpoints``: which is the newest to resume from,
which are pruned, which keep their training state; and the torch threads training runs on.

The engine serves one copy of the weights and the trainer updates another (all of it, or a LoRA
adapter over it); after each step the trainer saves its copy as ``checkpoints/step-N``
(:meth:`fulgor.weights.policy.Policy.save`: complete or absent) and the engine loads it. A run
restarted on the same run directory continues from the newest complete checkpoint
(:func:`latest_checkpoint`).

Checkpoints are pruned as training goes (:func:`prune_checkpoints`): the newest few stay, and so
does the one with the best validation accuracy; the others are renamed to a hidden name first and
then removed, so a checkpoint that is half deleted is never taken for one to resume from. Only the
newest keeps its optimiser state (:func:`drop_old_training_state`): a run resumes from the newest,
and an AdamW state is twice the weights, so a run's disk use would otherwise grow with its steps.

What it does not know: how weights are loaded or written (:mod:`fulgor.weights`). Needs
``fulgor[torch]`` for :func:`set_torch_threads` only.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fulgor.weights.lora import ADAPTERS_FILE
from fulgor.weights.policy import TRAINING_STATE_FILE, fsync_path

__all__ = [
    "OPTIMIZER_DIR",
    "checkpoint_accuracies",
    "drop_old_training_state",
    "kept_checkpoints",
    "latest_checkpoint",
    "prune_checkpoints",
    "set_torch_threads",
    "usable_cores",
]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
_PRUNED_DIR = re.compile(r"^\.step-\d+\.pruned$")
OPTIMIZER_DIR = "optimizer"
"""The optimiser's shards, when several ranks saved the checkpoint (:mod:`fulgor.training.distributed`)."""


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
        fsync_path(hidden.parent)  # the rename is on disk before any file in it is removed
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
