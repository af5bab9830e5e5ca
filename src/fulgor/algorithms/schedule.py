"""What GRPO and SFT answer alike: which tasks each step, how to sample, when to validate and stop.

:class:`StepSchedule` is a mixin over the attributes ``group_size``, ``batch_tasks``, ``seed``,
``max_steps``, ``val_every``, ``max_seconds``, ``temperature``, ``top_p``, ``max_tokens`` and
``max_trajectory_tokens``, which ``check_schedule`` checks; an algorithm of one's own may use it or
answer these parts of :class:`~fulgor.algorithms.base.Algorithm` itself.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from fulgor.errors import ConfigError
from fulgor.types import JsonDict, RolloutMode

__all__ = ["StepSchedule", "shuffled_index"]


class StepSchedule:
    """Tasks in shuffled passes, training and greedy validation sampling, ``val_every``, ``max_seconds``."""

    group_size: int
    batch_tasks: int
    seed: int
    max_steps: int
    val_every: int
    max_seconds: float | None
    temperature: float
    top_p: float
    max_tokens: int
    max_trajectory_tokens: int | None
    agent_match: str | None

    def check_schedule(self, counts: Sequence[str] = ()) -> None:
        """A ConfigError, named for the algorithm's class, for the first of these settings out of
        range; ``counts`` names more settings that must be >= 1."""
        kind = type(self).__name__
        for name in ("group_size", "batch_tasks", "max_steps", "val_every", "max_tokens", *counts):
            if getattr(self, name) < 1:
                raise ConfigError(f"{kind} {name} must be >= 1, got {getattr(self, name)}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ConfigError(
                f"{kind} max_seconds must be > 0 (or None for no limit), got {self.max_seconds}"
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(
                f"temperature must be >= 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}"
            )
        if self.max_trajectory_tokens is not None and self.max_trajectory_tokens < 2:
            raise ConfigError(f"max_trajectory_tokens must be >= 2, got {self.max_trajectory_tokens}")
        if self.agent_match is not None:
            try:
                re.compile(self.agent_match)
            except re.error as error:
                raise ConfigError(
                    f"{kind} agent_match {self.agent_match!r} is not a regular expression ({error}); "
                    "write one that matches agent names, e.g. 'write|rewrite'"
                ) from None

    def sampling_parameters(self, mode: RolloutMode) -> JsonDict:
        """What the agent passes to the model: the training temperature, or greedy for validation."""
        if mode == "val":
            return {"temperature": 0.0, "max_tokens": self.max_tokens}
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}

    def step_tasks(self, dataset: Sequence[Any], step: int) -> list[Any]:
        """The ``batch_tasks`` training tasks of ``step`` (1-based) from shuffled passes over the
        training set (reshuffled each pass, by ``seed``); the same step always gets the same.

        >>> from fulgor import GRPO
        >>> grpo = GRPO(group_size=4, batch_tasks=2)
        >>> sorted(grpo.step_tasks(["a", "b", "c", "d"], 1) + grpo.step_tasks(["a", "b", "c", "d"], 2))
        ['a', 'b', 'c', 'd']
        """
        if not dataset:
            raise ConfigError("the training dataset is empty; pass at least one task")
        start = (step - 1) * self.batch_tasks
        positions = range(start, start + self.batch_tasks)
        return [dataset[shuffled_index(len(dataset), position, self.seed)] for position in positions]

    def validates_at(self, step: int) -> bool:
        """Whether validation runs after ``step``: every ``val_every`` steps and after the last one."""
        return step % self.val_every == 0 or step == self.max_steps

    def out_of_time(self, elapsed_seconds: float) -> bool:
        """Whether the run has used up ``max_seconds`` of wall time (never without a limit)."""
        return self.max_seconds is not None and elapsed_seconds >= self.max_seconds


def shuffled_index(size: int, position: int, seed: int) -> int:
    """The index at ``position`` of a series of passes over ``range(size)``, each shuffled by
    ``seed`` and its pass number.

    >>> [sorted(shuffled_index(3, p, seed=0) for p in passed) for passed in (range(3), range(3, 6))]
    [[0, 1, 2], [0, 1, 2]]
    """
    epoch, offset = divmod(position, size)
    order = list(range(size))
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return order[offset]
