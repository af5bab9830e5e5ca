"""A run's trajectories as verl's ``DataProto`` on disk, for verl's trainer to train on.

Every rollout of the store that the Trainer would train on becomes samples (one per token row,
:func:`fulgor.algorithms.verl.to_data_proto`): the same rules (:func:`~fulgor.training.rollouts.read_outcome`:
succeeded rollouts only, none with spans lost or unreadable, ``agent_match``, ``max_tokens``), the
exact token ids and logprobs the engine sampled. The file is verl's own
(``DataProto.save_to_disk``; ``DataProto.load_from_disk`` reads it), written whole or not at all::

    python -m fulgor.training.verl_export runs/calc runs/calc/verl.dataproto
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fulgor.adapters.trajectory import DriftReport, Trajectory
from fulgor.algorithms.verl import to_data_proto
from fulgor.errors import ConfigError
from fulgor.store.base import Store
from fulgor.training.rollouts import read_outcome

__all__ = ["Export", "export_run", "main", "read_trajectories"]


@dataclass
class Export:
    """What an export wrote: ``samples`` rows of ``rollouts`` rollouts in ``groups`` groups, and the
    rollouts left out with their reasons (``left_out``: rollout id -> reason)."""

    path: Path
    samples: int
    rollouts: int
    groups: int
    left_out: dict[str, str]
    drift: DriftReport


async def read_trajectories(
    store: Store,
    *,
    rollout_ids: Sequence[str] | None = None,
    agent_match: str | None = None,
    max_tokens: int | None = None,
) -> tuple[list[Trajectory], dict[str, str], DriftReport]:
    """The trajectories of ``store``'s ended rollouts (of ``rollout_ids`` only, when given), in the
    store's order, the rollouts that gave none (id -> why) and the drift of the whole."""
    trajectories: list[Trajectory] = []
    left_out: dict[str, str] = {}
    drift = DriftReport()
    ended = await store.query_rollouts(status=["succeeded", "failed", "cancelled"])
    wanted = None if rollout_ids is None else set(rollout_ids)
    for rollout in ended if wanted is None else [r for r in ended if r.rollout_id in wanted]:
        outcome = await read_outcome(store, rollout, agent_match=agent_match, max_tokens=max_tokens)
        drift.add(outcome.drift)
        if outcome.trajectory is not None:
            trajectories.append(outcome.trajectory)
        else:
            left_out[rollout.rollout_id] = outcome.error or "no model call with token ids to train on"
    return trajectories, left_out, drift


async def export_run(
    source: str | Path | Store,
    out: str | Path,
    *,
    agent_match: str | None = None,
    max_tokens: int | None = None,
    pad_token_id: int = 0,
) -> Export:
    """Write the trajectories of ``source`` (a ``Store``, a run directory or its SQLite file) to
    ``out`` as verl's ``DataProto``; a ConfigError when there is no store or nothing to export."""
    if isinstance(source, Store):
        trajectories, left_out, drift = await read_trajectories(
            source, agent_match=agent_match, max_tokens=max_tokens
        )
    else:
        store = await _open(Path(source))
        try:
            trajectories, left_out, drift = await read_trajectories(
                store, agent_match=agent_match, max_tokens=max_tokens
            )
        finally:
            await store.close()
    if not trajectories:
        reasons = "; ".join(f"{key}: {value}" for key, value in list(left_out.items())[:5])
        raise ConfigError(
            f"the run has no rollout to export ({len(left_out)} rollouts, none trained on"
            + (f": {reasons}" if reasons else "")
            + "); record rollouts first (Trainer.dev, fulgor train --dev, or runners against fulgor serve)"
        )
    data = to_data_proto(trajectories, pad_token_id=pad_token_id)
    path = Path(out)
    await asyncio.to_thread(_write, data, path)
    groups = {t.group_id or t.rollout_id for t in trajectories}
    return Export(path, len(data), len(trajectories), len(groups), left_out, drift)


async def _open(path: Path) -> Store:
    from fulgor.store.sqlite import SqliteStore

    if await asyncio.to_thread(path.is_dir):
        path = path / "store.sqlite"
    if not await asyncio.to_thread(path.is_file):
        raise ConfigError(
            f"{path} does not exist; pass a run directory (its store.sqlite) or a SQLite store file"
        )
    return SqliteStore(path)


def _write(data: Any, path: Path) -> None:
    """Write whole or not at all: a partial file is renamed into place only once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        data.save_to_disk(str(partial))
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fulgor.training.verl_export SOURCE OUT``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m fulgor.training.verl_export",
        description="Write a run's trajectories as verl's DataProto (one sample per token row).",
    )
    parser.add_argument("source", help="a run directory, or its store.sqlite")
    parser.add_argument("out", help="the file to write (DataProto.load_from_disk reads it)")
    parser.add_argument("--agent-match", help="a regular expression: only these agents' calls")
    parser.add_argument("--max-tokens", type=int, help="truncate longer token rows")
    parser.add_argument("--pad-token-id", type=int, default=0, help="the tokenizer's pad id (default 0)")
    args = parser.parse_args(argv)
    try:
        export = asyncio.run(
            export_run(
                args.source,
                args.out,
                agent_match=args.agent_match,
                max_tokens=args.max_tokens,
                pad_token_id=args.pad_token_id,
            )
        )
    except (ConfigError, ImportError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    sys.stdout.write(
        f"wrote {export.samples} samples of {export.rollouts} rollouts in {export.groups} groups to "
        f"{export.path}; {len(export.left_out)} rollouts left out\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
