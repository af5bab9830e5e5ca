"""Checkpoints carry the updater's state: a run resumed from step k continues exactly as one that
never stopped, given the same trajectories (rollouts are sampled afresh by the engine, so two
sessions never see the same ones; the update from a given batch is what can match bit for bit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater
from fulgor.algorithms.lora import LoraConfig
from fulgor.engine.models import init_model
from fulgor.training.checkpoints import (
    TRAINING_STATE_FILE,
    Policy,
    latest_checkpoint,
    load_policy,
    load_training_state,
)

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
