"""Supervised fine-tuning: imitate the agent's own best rollouts (rejection sampling), another model's
recorded rollouts (distillation), or chat transcripts (a warm start)."""

from __future__ import annotations

from fulgor.algorithms.sft.algorithm import SFT, select_best
from fulgor.algorithms.sft.update import SFTConfig, SFTUpdater, chat_row

__all__ = ["SFT", "SFTConfig", "SFTUpdater", "chat_row", "select_best"]
