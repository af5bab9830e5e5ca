"""The trajectories the update-across-processes tests train on, in the test and under torchrun."""

from __future__ import annotations

from fulgor.adapters import Trajectory, TrajectoryRow


def row(prompt: list[int], response: list[int]) -> TrajectoryRow:
    return TrajectoryRow(
        token_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * len(response),
        sampled_logprobs=[0.0] * len(prompt) + [-2.5] * len(response),
        calls=[0],
        returns=[0.0] * (len(prompt) + len(response)),
    )


def batch(offset: int, flat: bool = False) -> list[Trajectory]:
    """Two groups of two rollouts with rewards that differ (``flat``: that are equal, so the batch
    teaches nothing and the update skips its optimiser step), rows of several lengths, one rollout
    of two rows: five rows, which two ranks in micro-batches of two split unevenly (one rank runs an
    idle micro-batch)."""
    trajectories = []
    for i in range(4):
        rows = [row([5 + offset, 6, 7 + i] + [9] * i, [20 + i + offset, 30 + i, 31][: 1 + i % 3])]
        if i == 3:
            rows.append(row([5, 8, 8, 8, 8, 8], [40 + offset, 41]))
        trajectories.append(
            Trajectory(
                rollout_id=f"r{offset}-{i}",
                group_id=f"g{offset}-{i // 2}",
                reward=1.0 if flat else float(i % 2),
                rows=rows,
                model_versions=[],
            )
        )
    return trajectories
