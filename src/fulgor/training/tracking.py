"""Training metrics to TensorBoard or Weights & Biases, besides ``metrics.jsonl``.

A tracker is configured by instance (``TensorBoardTracker()``, ``WandbTracker(project=...)``) and
passed to ``Trainer(trackers=...)``. For one ``fit`` the trainer calls ``start(run_dir, config)``,
then ``log(metrics, step)`` once per step with every number of that step's ``metrics.jsonl`` line
(``step`` is the x axis; a metric the step did not have, such as validation accuracy between
validations, is left out), then ``finish()``. Any object with these three methods is a tracker.
A tracker whose ``log`` fails (W&B's network, a full disk) does not stop training: the first
failure of each tracker is logged with its error, and every step is still offered to it.

What it does not know: what the metrics mean or how they are computed (the trainer). Needs
``fulgor[tracking]``; a missing package is a ConfigError when the tracker is built.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from fulgor.errors import ConfigError
from fulgor.types import JsonDict

__all__ = ["TensorBoardTracker", "Tracker", "WandbTracker", "scalar_metrics", "start_tracking"]

logger = logging.getLogger(__name__)

_WANDB_ID_FILE = "wandb_run_id"

WandbMode = Literal["online", "offline", "disabled"]


class Tracker(Protocol):
    """Receives a training run's metrics, one call per step."""

    def start(self, run_dir: Path, config: JsonDict) -> None:
        """Open the run (``config``: the algorithm's hyperparameters)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record the numbers of step ``step``."""

    def finish(self) -> None:
        """Write what is buffered and close; the trainer calls it however ``fit`` ends."""


def _require(module: str, tracker: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{tracker} needs the {module} package: pip install 'fulgor[tracking]' (or pip install {module})"
        )


class TensorBoardTracker:
    """Scalars in TensorBoard event files under ``log_dir`` (default ``run_dir/tensorboard``).

    A resumed run adds an event file to the same directory; TensorBoard shows both as one run.
    """

    def __init__(self, log_dir: str | Path | None = None) -> None:
        _require("tensorboard", "TensorBoardTracker")
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._writer: Any = None

    def start(self, run_dir: Path, config: JsonDict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.log_dir or run_dir / "tensorboard"
        self._writer = SummaryWriter(log_dir=str(log_dir))
        self._writer.add_text("config", f"```\n{json.dumps(config, indent=2, sort_keys=True)}\n```")
        logger.info("TensorBoard logs in %s", log_dir)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbTracker:
    """A Weights & Biases run in ``project``.

    ``mode`` is W&B's own (``online``, ``offline``, ``disabled``; None: ``WANDB_MODE`` or online).
    Files go under ``directory`` (default: ``WANDB_DIR`` when set, else the run directory). The W&B
    run id is kept in ``run_dir/wandb_run_id``, so a resumed training run continues the same W&B run.
    """

    def __init__(
        self,
        *,
        project: str = "fulgor",
        name: str | None = None,
        entity: str | None = None,
        mode: WandbMode | None = None,
        directory: str | Path | None = None,
        tags: Sequence[str] = (),
    ) -> None:
        _require("wandb", "WandbTracker")
        if mode not in (None, "online", "offline", "disabled"):
            raise ConfigError(f"WandbTracker mode must be online, offline or disabled, got {mode!r}")
        self.project = project
        self.name = name
        self.entity = entity
        self.mode = mode
        self.directory = Path(directory) if directory is not None else None
        self.tags = tuple(tags)
        self._run: Any = None

    def start(self, run_dir: Path, config: JsonDict) -> None:
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        id_file = run_dir / _WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        directory = self.directory or (None if os.environ.get("WANDB_DIR") else run_dir)
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(
                project=self.project,
                name=self.name or run_dir.resolve().name,
                entity=self.entity,
                mode=self.mode,
                dir=str(directory) if directory is not None else None,
                id=run_id,
                resume="allow",
                config=config,
                tags=list(self.tags),
            )
        except wandb.errors.Error as error:
            raise ConfigError(
                f"W&B could not start a run: {error}; log in with `wandb login`, or pass "
                "WandbTracker(mode='offline') to write the run locally and `wandb sync` it later"
            ) from error
        id_file.write_text(run_id)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self) -> None:
        import wandb

        if self._run is None:
            return
        self._run.finish()
        self._run = None
        if wandb.run is None:  # no other run in this process: stop W&B's service process too
            wandb.teardown()


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one ``metrics.jsonl`` line, without ``step`` (the x axis) and empty values.

    >>> scalar_metrics({"step": 3, "reward_mean": 0.5, "val_accuracy": None, "rollouts": 8})
    {'reward_mean': 0.5, 'rollouts': 8.0}
    """
    return {
        name: float(value)
        for name, value in metrics.items()
        if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


@contextlib.contextmanager
def start_tracking(
    trackers: Sequence[Tracker], run_dir: Path, config: JsonDict
) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """Start every tracker and give a function that sends one ``metrics.jsonl`` line to each;
    finish each tracker started, however the block ends. A failing ``log`` is logged (once per
    tracker) and skipped: ``metrics.jsonl`` already holds the step, and the run goes on."""
    failed: set[int] = set()  # id() of the trackers whose failure was logged

    def track(metrics: Mapping[str, Any]) -> None:
        scalars = scalar_metrics(metrics)
        step = int(metrics["step"])
        for tracker in trackers:
            try:
                tracker.log(scalars, step)
            except Exception as error:  # a tracker is another service's client: it must not end the run
                if id(tracker) not in failed:
                    failed.add(id(tracker))
                    logger.warning(
                        "%s could not log step %d (%r); training goes on, and later failures of this "
                        "tracker are not logged (metrics.jsonl holds every step)",
                        type(tracker).__name__,
                        step,
                        error,
                        exc_info=error,
                    )

    with contextlib.ExitStack() as stack:
        for tracker in trackers:
            tracker.start(run_dir, config)
            stack.callback(tracker.finish)
        yield track
