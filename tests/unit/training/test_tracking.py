"""Metrics trackers write what the real TensorBoard and W&B readers read back (W&B offline)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

from tests.tracking_support import tensorboard_scalars, wandb_config, wandb_history

from fulgor.errors import ConfigError
from fulgor.training.tracking import TensorBoardTracker, WandbTracker, start_tracking

LINES = [
    {"step": 1, "model_version": 1, "reward_mean": 0.25, "val_accuracy": None, "seconds/update_policy": 0.5},
    {"step": 2, "model_version": 2, "reward_mean": 0.75, "val_accuracy": 0.5, "drift/merge_breaks": 0},
]
CONFIG = {"algorithm": "grpo", "group_size": 4, "config/learning_rate": 1e-3}


def send(trackers: list[TensorBoardTracker | WandbTracker], run_dir: Path) -> None:
    with start_tracking(trackers, run_dir, CONFIG) as track:
        for line in LINES:
            track(line)


def test_tensorboard_gets_every_number_of_every_step(tmp_path: Path) -> None:
    send([TensorBoardTracker()], tmp_path / "run")

    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert scalars == {
        "model_version": {1: 1.0, 2: 2.0},
        "reward_mean": {1: 0.25, 2: 0.75},
        "val_accuracy": {2: 0.5},
        "seconds/update_policy": {1: 0.5},
        "drift/merge_breaks": {2: 0.0},
    }


def test_wandb_offline_writes_the_run_and_a_resumed_session_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    send([WandbTracker(project="tests")], run_dir)

    run_id = (run_dir / "wandb_run_id").read_text()
    [run_file] = (tmp_path / "wandb-dir" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    assert wandb_history(run_file) == {
        1: {"model_version": 1, "reward_mean": 0.25, "seconds/update_policy": 0.5},
        2: {"model_version": 2, "reward_mean": 0.75, "val_accuracy": 0.5, "drift/merge_breaks": 0},
    }
    assert wandb_config(run_file) == CONFIG

    # The next session on the same run directory logs to the same W&B run id. (Its own WANDB_DIR:
    # offline run folders are named to the second, and two sessions may start in the same one.)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir-2"))
    with start_tracking([WandbTracker(project="tests")], run_dir, CONFIG) as track:
        track({"step": 3, "reward_mean": 1.0})
    [resumed] = (tmp_path / "wandb-dir-2" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    assert wandb_history(resumed) == {3: {"reward_mean": 1}}


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"fulgor\[tracking\]"):
        WandbTracker()
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match=r"TensorBoardTracker needs the tensorboard package"):
        TensorBoardTracker()


def test_wandb_mode_is_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="online, offline or disabled"):
        WandbTracker(mode="ofline")  # type: ignore[arg-type]


def test_trackers_started_are_finished_when_the_run_fails(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(log_dir=tmp_path / "tb")

    def failing_run() -> None:
        with start_tracking([tracker], tmp_path, CONFIG) as track:
            track(LINES[0])
            raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        failing_run()
    assert tracker._writer is None  # closed
    assert tensorboard_scalars(tmp_path / "tb")["reward_mean"] == {1: 0.25}
