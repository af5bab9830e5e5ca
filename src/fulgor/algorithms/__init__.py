"""Algorithms that turn trajectories into better weights (GRPO family), prompts or fine-tunes.

:class:`Algorithm` (in :mod:`fulgor.algorithms.base`) is what the Trainer asks of each of them.
"""

from fulgor.algorithms.base import Algorithm, Updater

__all__ = ["Algorithm", "Updater"]
