"""Supervised fine-tuning on token rows: the warm start before RL, or training on the best trajectories."""

from __future__ import annotations

from fulgor.algorithms.sft.update import SFTConfig, SFTUpdater, chat_row

__all__ = ["SFTConfig", "SFTUpdater", "chat_row"]
