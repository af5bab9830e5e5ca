"""Checkpoints carry the updater's state: a run resumed from step k continues exactly as one that
never stopped, given the same trajectories (rollouts are sampled afresh by the engine, so two
sessions never see the same ones; the update from a given batch is what can match bit for bit)."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from fulgor import GRPO, Trainer
from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError
from fulgor.training.checkpoints import checkpoint_accuracies, kept_checkpoints, latest_checkpoint
from fulgor.training.reports import MetricsLog
from fulgor.weights.lora import LoraConfig
from fulgor.weights.policy import TRAINING_STATE_FILE, Policy, load_policy, load_training_state

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONFIG = GRPOConfig(learning_rate=1e-3, weight_decay=0.01)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("checkpoints") / "tiny", "tiny", seed=0)


def row(prompt: list[int], response: list[int]) -> TrajectoryRow:
    return TrajectoryRow(
        token_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * len(response),
        sampled_logprobs=[0.0] * len(prompt) + [-2.0] * len(response),
        calls=[0],
        returns=[0.0] * (len(prompt) + len(response)),
    )


def batch(offset: int) -> list[Trajectory]:
    """Two groups of two rollouts whose rewards differ: every update moves the weights."""
    return [
        Trajectory(
            rollout_id=f"r{offset}-{i}",
            group_id=f"g{offset}-{i // 2}",
            reward=float(i % 2),
            rows=[row([5 + offset, 6, 7 + i], [20 + i + offset, 30 + i])],
            model_versions=[],
        )
        for i in range(4)
    ]


def weights(model: Any) -> dict[str, Any]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize("lora", [None, LoraConfig(rank=4)], ids=["full", "lora"])
def test_a_resumed_updater_reaches_the_same_weights_bit_for_bit(
    tmp_path: Path, model_dir: Path, lora: LoraConfig | None
) -> None:
    policy = load_policy(model_dir, "cpu", lora)
    updater = PolicyUpdater(policy.model, CONFIG)
    updater.step(batch(0))
    checkpoint = policy.save(tmp_path, 1, {"updater": updater.state_dict()})
    saved_moments = {
        name: [state["exp_avg"].clone(), state["exp_avg_sq"].clone()]
        for name, state in updater.optimizer.state_dict()["state"].items()
    }
    updater.step(batch(1))
    uninterrupted = weights(policy.model)

    state = load_training_state(checkpoint)
    assert state is not None
    assert state["step"] == 1
    resumed_policy = load_policy(checkpoint, "cpu", lora)
    resumed = PolicyUpdater(resumed_policy.model, CONFIG)
    resumed.load_state_dict(state["updater"])
    restored = resumed.optimizer.state_dict()["state"]
    assert restored.keys() == saved_moments.keys()
    for name, (exp_avg, exp_avg_sq) in saved_moments.items():
        assert torch.equal(restored[name]["exp_avg"], exp_avg)
        assert torch.equal(restored[name]["exp_avg_sq"], exp_avg_sq)
        assert float(restored[name]["step"]) == 1.0
    resumed.step(batch(1))
    for name, tensor in weights(resumed_policy.model).items():
        assert torch.equal(tensor, uninterrupted[name]), name

    # Without the optimiser state, the same step from the same weights lands elsewhere.
    fresh_policy = load_policy(checkpoint, "cpu", lora)
    PolicyUpdater(fresh_policy.model, CONFIG).step(batch(1))
    assert any(not torch.equal(t, uninterrupted[n]) for n, t in weights(fresh_policy.model).items())


def test_a_checkpoint_is_complete_or_absent_and_may_hold_no_state(tmp_path: Path, model_dir: Path) -> None:
    policy = load_policy(model_dir, "cpu")
    plain = Policy(policy.model, policy.tokenizer).save(tmp_path, 3)
    assert load_training_state(plain) is None
    assert latest_checkpoint(tmp_path) == (3, plain)
    with_state = policy.save(tmp_path, 4, {"note": "x"})
    assert (with_state / TRAINING_STATE_FILE).is_file()
    assert load_training_state(with_state) == {"step": 4, "note": "x"}
    assert not list(tmp_path.glob(".*partial"))


def test_loading_and_saving_weights_draws_no_progress_bars(
    tmp_path: Path, model_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A trainer loads and saves weights at every step: transformers' bars would fill its logs.
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    assert transformers_logging.is_progress_bar_enabled()
    AutoModelForCausalLM.from_pretrained(model_dir)
    assert "Loading weights" in capfd.readouterr().err  # what the trainer would otherwise print
    policy = load_policy(model_dir, "cpu")
    policy.save(tmp_path, 1)
    init_model(tmp_path / "built", "tiny", seed=0)
    assert "█" not in capfd.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()  # the process's own setting, as it was


def test_a_save_that_fails_leaves_no_step_and_no_partial_copy(tmp_path: Path, model_dir: Path) -> None:
    policy = load_policy(model_dir, "cpu")
    policy.save(tmp_path, 1)

    class Full:  # a tokenizer whose save fails half way, as on a full disk
        def save_pretrained(self, path: Path) -> None:
            (Path(path) / "tokenizer.json").write_text("{")
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        Policy(policy.model, Full()).save(tmp_path, 2)
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step-1")  # the last good one still counts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc (Linux)")
def test_a_checkpoint_reaches_the_disk_before_it_is_renamed_into_place(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file (and the rename) is fsynced: after a power cut a step-N never has empty files."""
    import os

    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    checkpoint = load_policy(model_dir, "cpu").save(tmp_path, 5, {"note": "x"})
    partial = str(tmp_path / ".step-5.partial")
    files = {str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()}
    assert TRAINING_STATE_FILE in files
    assert "config.json" in files
    synced_files = {path.removeprefix(partial + "/") for path in synced if path.startswith(partial + "/")}
    assert synced_files == files
    assert partial in synced  # the directory's entries
    assert synced[-1] == str(tmp_path)  # the rename, after everything in it


def test_a_file_system_that_cannot_flush_directories_still_takes_checkpoints(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some network and FUSE file systems answer fsync on a directory with EINVAL: files are still
    flushed, the checkpoint is saved, and a failing fsync of a file still fails the save."""
    import errno
    import os
    import stat

    real_fsync = os.fsync

    def no_directory_fsync(descriptor: int) -> None:
        if stat.S_ISDIR(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", no_directory_fsync)
    policy = load_policy(model_dir, "cpu")
    assert policy.save(tmp_path, 1) == tmp_path / "step-1"

    def failing_fsync(descriptor: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        policy.save(tmp_path, 2)
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "step-1")


# -- pruning ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "keep", "val_accuracy", "kept"),
    [
        (range(1, 7), 2, {2: 0.5, 4: 0.9, 6: 0.7}, {4, 5, 6}),
        (range(1, 7), 2, {2: 0.9, 4: 0.9, 5: 0.3}, {2, 5, 6}),  # a tie: the earliest stays the best
        (range(1, 7), 2, {3: 0.2, 6: 0.9}, {5, 6}),  # the best is among the newest
        (range(1, 7), 1, {3: 0.8, 5: 0.4}, {3, 6}),
        (range(1, 7), 2, {}, {5, 6}),  # no validation: the newest only
        (range(1, 7), 0, {2: 0.9}, {1, 2, 3, 4, 5, 6}),  # 0 keeps every one
        (range(3, 7), 2, {1: 1.0, 4: 0.5}, {4, 5, 6}),  # an accuracy without a checkpoint counts not
        ([4], 2, {}, {4}),
    ],
)
def test_pruning_keeps_the_newest_n_and_the_best_validated(
    steps: range | list[int], keep: int, val_accuracy: dict[int, float], kept: set[int]
) -> None:
    assert kept_checkpoints(steps, keep, val_accuracy) == kept


def test_checkpoint_accuracies_are_the_validations_after_step_0() -> None:
    history = [
        {"step": 0, "val_accuracy": 0.9},  # the model the run started from, not a checkpoint
        {"step": 1, "reward_mean": 0.5},
        {"step": 2, "val_accuracy": 0.25},
        {"step": 3, "val_accuracy": None},  # a NaN, written as null
        {"step": 4, "val_accuracy": 1},
    ]
    assert checkpoint_accuracies(history) == {2: 0.25, 4: 1.0}


def on_disk(checkpoints: Path) -> list[str]:
    return sorted(entry.name for entry in checkpoints.iterdir())


def names(*steps: int) -> list[str]:
    return sorted(f"step-{step}" for step in steps)


class Session:
    """Training steps as ``Trainer.fit`` runs them, without the services: an update, the checkpoint
    with the updater's state, the step's metrics line, then the trainer's own pruning."""

    def __init__(self, trainer: Trainer, model_dir: Path, start_step: int = 0) -> None:
        self.trainer = trainer
        self.policy, self.updater = trainer._trainable(model_dir, start_step)
        self.log = MetricsLog(trainer.run_dir / "metrics.jsonl")

    def step(self, step: int, val_accuracy: float | None = None) -> list[str]:
        """Run ``step`` (validated when ``val_accuracy`` is given); returns what is left on disk."""
        self.updater.step(batch(step % 2))
        self.policy.save(self.trainer.checkpoints_dir, step, {"updater": self.updater.state_dict()})
        validation = {} if val_accuracy is None else {"val_accuracy": val_accuracy}
        self.log.write({"step": step, "reward_mean": 0.5, **validation})
        asyncio.run(self.trainer.prune_checkpoints(step))
        return on_disk(self.trainer.checkpoints_dir)


def trainer_on(run_dir: Path, model_dir: Path, **options: Any) -> Trainer:
    return Trainer(
        algorithm=GRPO(config=CONFIG), engine=EngineConfig(model=model_dir, device="cpu"), run_dir=run_dir,
        **options,
    )  # fmt: skip


def test_training_keeps_the_newest_two_and_the_best_and_a_resumed_run_keeps_that_best(
    tmp_path: Path, model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    MetricsLog(run_dir / "metrics.jsonl").write({"step": 0, "val_accuracy": 1.0})  # the base model
    first = Session(trainer_on(run_dir, model_dir), model_dir)
    assert first.trainer.keep_checkpoints == 2  # the default
    assert first.step(1) == names(1)
    assert first.step(2, val_accuracy=0.5) == names(1, 2)
    assert first.step(3) == names(2, 3)
    assert first.step(4, val_accuracy=0.75) == names(3, 4)  # step 2 is no longer the best
    assert first.step(5) == names(4, 5)
    assert first.step(6, val_accuracy=0.75) == names(4, 5, 6)  # a tie: step 4 stays the best
    assert first.step(7) == names(4, 6, 7)
    assert not list(run_dir.glob("checkpoints/.*"))  # nothing half deleted left behind

    # A new session on the same run directory continues from the newest checkpoint, with its
    # optimiser state (7 steps), and knows the accuracies of the first session's steps.
    trainer = trainer_on(run_dir, model_dir)
    start_step, model = trainer._starting_point(training=True)
    assert (start_step, model) == (7, run_dir / "checkpoints" / "step-7")
    second = Session(trainer, model, start_step)
    moments = second.updater.optimizer.state_dict()["state"].values()
    assert {float(state["step"]) for state in moments} == {7.0}
    assert second.step(8, val_accuracy=0.5) == names(4, 7, 8)
    assert second.step(9) == names(4, 8, 9)
    assert second.step(10, val_accuracy=0.875) == names(9, 10)  # a new best, among the newest
    assert latest_checkpoint(run_dir / "checkpoints") == (10, run_dir / "checkpoints" / "step-10")


def test_keep_checkpoints_sets_how_many_of_the_newest_stay_and_0_keeps_all(
    tmp_path: Path, model_dir: Path
) -> None:
    one = Session(trainer_on(tmp_path / "one", model_dir, keep_checkpoints=1), model_dir)
    assert [one.step(step) for step in (1, 2, 3)] == [names(1), names(2), names(3)]
    every = Session(trainer_on(tmp_path / "all", model_dir, keep_checkpoints=0), model_dir)
    assert [every.step(step, val_accuracy=0.5) for step in (1, 2, 3)][-1] == names(1, 2, 3)
    with pytest.raises(ConfigError, match=r"keep_checkpoints must be 0 \(keep every checkpoint\) or more"):
        trainer_on(tmp_path / "none", model_dir, keep_checkpoints=-1)


def test_a_deletion_that_fails_is_logged_and_never_leaves_a_checkpoint_to_resume_from_half_deleted(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    session = Session(trainer_on(run_dir, model_dir, keep_checkpoints=1), model_dir)
    session.step(1)
    checkpoints = run_dir / "checkpoints"
    real_rmtree = shutil.rmtree

    def fails_half_way(path: Path, *args: Any, **kwargs: Any) -> None:
        # Pruning a checkpoint: its weights go, then the disk fails (saving cleans up ignoring errors).
        if Path(path).parent == checkpoints and not kwargs.get("ignore_errors"):
            (Path(path) / "model.safetensors").unlink()
            raise OSError(5, "Input/output error")
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", fails_half_way)
    with caplog.at_level(logging.WARNING):
        assert session.step(2) == [".step-1.pruned", "step-2"]
    assert "could not remove" in caplog.text
    assert "Input/output error" in caplog.text
    assert latest_checkpoint(checkpoints) == (2, checkpoints / "step-2")  # never the half-deleted one
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)

    real_rename = Path.rename

    def refuses_step_2(self: Path, target: Path) -> Path:
        if self.name == "step-2":
            raise PermissionError(13, "Permission denied")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", refuses_step_2)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert session.step(3) == names(2, 3)  # the leftover went, step 2 could not
    assert f"could not delete the checkpoint {checkpoints / 'step-2'}" in caplog.text
    monkeypatch.setattr(Path, "rename", real_rename)
    assert session.step(4) == names(4)  # training went on, and the next prune catches up


def test_pruning_leaves_a_checkpoint_being_written_and_unreadable_metrics_leave_all(
    tmp_path: Path, model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    session = Session(trainer_on(run_dir, model_dir, keep_checkpoints=1), model_dir)
    session.step(1)
    writing = run_dir / "checkpoints" / ".step-3.partial"
    writing.mkdir()
    (writing / "config.json").write_text("{}")
    assert session.step(2) == [".step-3.partial", "step-2"]

    with (run_dir / "metrics.jsonl").open("a") as file:
        file.write("{not json\n")
    with caplog.at_level(logging.WARNING):
        assert session.step(3) == names(2, 3)  # which one is the best is unknown: none goes
    assert "checkpoints left in place, not pruned" in caplog.text


def test_only_the_newest_checkpoint_keeps_its_training_state(tmp_path: Path) -> None:
    from fulgor.training.checkpoints import OPTIMIZER_DIR, drop_old_training_state

    for step in (1, 2, 3):
        checkpoint = tmp_path / f"step-{step}"
        (checkpoint / OPTIMIZER_DIR).mkdir(parents=True)
        (checkpoint / OPTIMIZER_DIR / "shard-0").write_bytes(b"s")
        (checkpoint / "config.json").write_text("{}")
        (checkpoint / "model.safetensors").write_bytes(b"w")
        (checkpoint / TRAINING_STATE_FILE).write_bytes(b"t")
    (tmp_path / ".step-4.partial").mkdir()
    (tmp_path / ".step-4.partial" / TRAINING_STATE_FILE).write_bytes(b"t")  # being written: untouched

    assert drop_old_training_state(tmp_path) == [1, 2]
    for step in (1, 2):
        assert sorted(p.name for p in (tmp_path / f"step-{step}").iterdir()) == [
            "config.json",
            "model.safetensors",
        ]
    assert (tmp_path / "step-3" / TRAINING_STATE_FILE).is_file()
    assert (tmp_path / "step-3" / OPTIMIZER_DIR / "shard-0").is_file()
    assert (tmp_path / ".step-4.partial" / TRAINING_STATE_FILE).is_file()
    assert drop_old_training_state(tmp_path) == []  # nothing left to drop
