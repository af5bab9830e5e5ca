"""A run's trajectories exported as verl's DataProto, read back with verl's own loader."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from fulgor.errors import ConfigError
from fulgor.store import SqliteStore
from fulgor.testing.rollouts import write_rollouts
from fulgor.training.verl_export import export_run, read_trajectories

pytest.importorskip(
    "verl", reason="the verl bridge needs verl: pip install --no-deps -r requirements-verl.txt"
)


@pytest.fixture
async def run_dir(tmp_path: Path) -> Path:
    """A run directory whose store holds 12 ended rollouts: three turns each, every fifth failed, the
    first call of every fourth without token ids (as through an upstream that returns none)."""
    store = SqliteStore(tmp_path / "run" / "store.sqlite")
    await write_rollouts(store, 12, calls=3, group_size=4, failed_every=5, missing_ids_every=4)
    await store.close()
    return tmp_path / "run"


async def test_the_export_holds_exactly_the_tokens_the_engine_sampled(run_dir: Path, tmp_path: Path) -> None:
    from verl import DataProto

    store = SqliteStore(run_dir / "store.sqlite")
    try:
        trajectories, left_out, _ = await read_trajectories(store)
    finally:
        await store.close()
    export = await export_run(run_dir, tmp_path / "out" / "batch.dataproto")
    data = DataProto.load_from_disk(str(export.path))
    rows = [(t, r) for t in trajectories for r in t.rows]
    assert len(data) == export.samples == len(rows) > 0
    assert export.rollouts == len(trajectories)
    assert len(left_out) == 12 - len(trajectories) == 2
    assert all("the agent raised" in reason for reason in export.left_out.values())  # the failed ones
    assert export.drift.calls_missing_ids == 3  # counted, and their tokens not exported
    for b, (t, r) in enumerate(rows):
        attention = data.batch["attention_mask"][b].bool()
        assert data.batch["input_ids"][b][attention].tolist() == r.token_ids
        response = data.batch["response_mask"][b].bool()
        width = data.batch["responses"].shape[1]
        sampled = [i for i, m in enumerate(r.loss_mask) if m]
        assert data.batch["input_ids"][b][-width:][response].tolist() == [r.token_ids[i] for i in sampled]
        assert data.batch["rollout_log_probs"][b][response].tolist() == pytest.approx(
            [r.sampled_logprobs[i] for i in sampled]
        )
        assert float(data.batch["token_level_scores"][b].sum()) == pytest.approx(t.reward)
        assert data.non_tensor_batch["rollout_id"][b] == t.rollout_id
        assert data.non_tensor_batch["uid"][b] == t.group_id
    assert not list((tmp_path / "out").glob("*.partial"))


def test_the_module_runs_from_the_command_line(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "batch.dataproto"
    done = subprocess.run(
        [sys.executable, "-m", "fulgor.training.verl_export", str(run_dir), str(out), "--max-tokens", "12"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "rollouts left out" in done.stdout
    assert out.is_file()
    from verl import DataProto

    lengths = DataProto.load_from_disk(str(out)).batch["attention_mask"].sum(1)
    assert int(lengths.max()) == 12  # rows cut to --max-tokens


async def test_nothing_to_export_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "run" / "store.sqlite")
    await write_rollouts(store, 3, failed_every=1)
    await store.close()
    with pytest.raises(ConfigError, match=r"no rollout to export \(3 rollouts, none trained on"):
        await export_run(tmp_path / "run", tmp_path / "batch.dataproto")
    with pytest.raises(ConfigError, match="does not exist; pass a run directory"):
        await export_run(tmp_path / "elsewhere", tmp_path / "batch.dataproto")
    assert not [path.name for path in await asyncio.to_thread(tmp_path.iterdir) if "batch" in path.name]
