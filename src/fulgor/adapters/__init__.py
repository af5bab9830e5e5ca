"""Adapters: spans -> trajectories (token rows, masks, rewards) and a drift report."""

from __future__ import annotations

from fulgor.adapters.trajectory import (
    DriftReport,
    Trajectory,
    TrajectoryRow,
    build_trajectory,
    model_calls,
    rollout_feedback,
    rollout_reward,
    verify_rows,
)

__all__ = [
    "DriftReport",
    "Trajectory",
    "TrajectoryRow",
    "build_trajectory",
    "model_calls",
    "rollout_feedback",
    "rollout_reward",
    "verify_rows",
]
