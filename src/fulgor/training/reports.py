"""What the trainer reports: a dev run's per-rollout table, and one JSON line of metrics per step.

``DevReport`` lists each rollout's status, reward, model calls and drift; ``str(report)`` is a
table to print. ``MetricsLog`` appends one JSON object per training step to ``metrics.jsonl`` (a
number that is not finite, such as a NaN loss, is written as ``null``: JSON has no NaN);
``PhaseTimer`` measures the seconds each named step of a training step took. ``QUIET_LOGGERS``
are the loggers of the services a run starts, which log every request: a script that shows the
trainer's own lines sets them to WARNING.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fulgor.adapters.trajectory import DriftReport
from fulgor.training.rollouts import RolloutOutcome

__all__ = [
    "QUIET_LOGGERS",
    "DevReport",
    "MetricsLog",
    "PhaseTimer",
    "ProgressBar",
    "RolloutReport",
    "drift_total",
]

# The loggers that speak for every request (servers, HTTP clients, fulgor's services).
QUIET_LOGGERS = ("uvicorn", "uvicorn.error", "httpx", "fulgor.engine", "fulgor.gateway", "fulgor.store")

# Drift counters that are not problems: how many calls there were and how many were trained.
_VOLUME_COUNTERS = ("calls_total", "calls_trained")


@dataclass(frozen=True)
class RolloutReport:
    """One rollout of a dev run."""

    rollout_id: str
    status: str
    reward: float | None
    model_calls: int
    drift: dict[str, int]
    resources_id: str | None = None
    error: str | None = None

    @classmethod
    def from_outcome(cls, outcome: RolloutOutcome) -> RolloutReport:
        return cls(
            rollout_id=outcome.rollout.rollout_id,
            status=outcome.rollout.status,
            reward=outcome.reward,
            model_calls=outcome.model_calls,
            drift={name: int(value) for name, value in vars(outcome.drift).items()},
            resources_id=outcome.rollout.resources_id,
            error=outcome.error,
        )

    @property
    def problems(self) -> dict[str, int]:
        """The drift counters that are not zero, volume counters left out."""
        return {k: v for k, v in self.drift.items() if v and k not in _VOLUME_COUNTERS}


@dataclass(frozen=True)
class DevReport:
    """A dev run: every rollout, and totals."""

    rollouts: list[RolloutReport]

    @property
    def reward_mean(self) -> float | None:
        rewards = [r.reward for r in self.rollouts if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def drift(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for report in self.rollouts:
            for name, value in report.drift.items():
                total[name] = total.get(name, 0) + value
        return total

    def summary(self) -> str:
        """One line: how many rollouts, how many succeeded, the mean reward."""
        mean = "-" if self.reward_mean is None else f"{self.reward_mean:.3f}"
        succeeded = sum(1 for r in self.rollouts if r.status == "succeeded")
        return f"{len(self.rollouts)} rollouts, {succeeded} succeeded, reward mean {mean}"

    def __str__(self) -> str:
        lines = [f"{'rollout':<24} {'status':<10} {'reward':>7} {'calls':>5}  drift / error"]
        for r in self.rollouts:
            reward = "-" if r.reward is None else f"{r.reward:.3f}"
            notes = ", ".join(f"{k}={v}" for k, v in r.problems.items()) or "ok"
            if r.error:
                notes = f"{notes}; {r.error}"
            lines.append(f"{r.rollout_id:<24} {r.status:<10} {reward:>7} {r.model_calls:>5}  {notes}")
        lines.append(self.summary())
        return "\n".join(lines)


def drift_total(outcomes: Sequence[RolloutOutcome]) -> DriftReport:
    total = DriftReport()
    for outcome in outcomes:
        total.add(outcome.drift)
    return total


class PhaseTimer:
    """Seconds per named phase: ``with timer("update_policy"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


@dataclass
class MetricsLog:
    """Appends one JSON object per step to ``path`` (a restarted run appends to the same file).

    ``elapsed_seconds`` counts the run's wall time: this session's, plus what the file's last
    ``elapsed_seconds`` says earlier sessions took.
    """

    path: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    _started: float = field(default_factory=time.monotonic, repr=False)
    _earlier: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.path.is_file():
            for line in reversed(self.path.read_text().splitlines()):
                with contextlib.suppress(json.JSONDecodeError, TypeError, ValueError):
                    if "elapsed_seconds" in (last := json.loads(line)):
                        self._earlier = float(last["elapsed_seconds"])
                        break

    def elapsed_seconds(self) -> float:
        return self._earlier + time.monotonic() - self._started

    def write(self, metrics: dict[str, Any]) -> None:
        """Append ``metrics``, NaN and infinities as ``null`` (``history`` gets what the file holds)."""
        metrics = _finite_or_null(metrics)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as file:
            file.write(json.dumps(metrics, sort_keys=False, allow_nan=False) + "\n")
        self.history.append(metrics)


def _finite_or_null(value: Any) -> Any:
    """``value`` with every float that is not finite, in it or in dicts and lists in it, as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    return value


class ProgressBar:
    """Training progress on stderr (tqdm): steps done, latest reward and validation accuracy."""

    def __init__(self, done: int, total: int, *, enabled: bool = True) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=done, desc="training", unit="step", dynamic_ncols=True)
        self._shown: dict[str, str] = {}

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()

    def update(self, metrics: dict[str, Any]) -> None:
        """Show ``metrics`` (a step's line of ``metrics.jsonl``); a training step advances the bar."""
        if self._bar is None:
            return
        shown = (
            ("reward_mean", "reward"),
            ("val_accuracy", "val"),
            ("tool_call_rate", "tools"),
            ("best_score", "best"),
        )
        for key, label in shown:
            if isinstance(metrics.get(key), int | float):
                self._shown[label] = f"{metrics[key]:.3f}"
        self._bar.set_postfix(self._shown, refresh=False)
        self._bar.update(1 if metrics.get("step", 0) > 0 else 0)
