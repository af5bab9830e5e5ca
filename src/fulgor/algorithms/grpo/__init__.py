"""GRPO family: the algorithm (``GRPO``), its update hyperparameters (``GRPOConfig``), advantage
estimators and losses (``core``) and the torch update (``update``); training needs ``fulgor[torch]``."""

from __future__ import annotations

from fulgor.algorithms.grpo.algorithm import GRPO
from fulgor.algorithms.grpo.config import GRPOConfig

__all__ = ["GRPO", "GRPOConfig"]
