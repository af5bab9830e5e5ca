"""One LoRA adapter per agent over one frozen base: each adapter learns from its own agents' calls.

``AdapterUpdater`` holds one :class:`~fulgor.algorithms.grpo.update.PolicyUpdater` (with its own
optimiser) per adapter of a peft model with several named adapters. A step hands each adapter the
rows of the agents it serves (the longest adapter name the agent's name starts with,
:func:`fulgor.types.agent_key`), with every rollout of the batch still present, so that its
advantages compare a rollout with its whole group; an adapter with no row this step is left alone.

What it does not know: where rows come from, or how adapters are saved and served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fulgor.adapters.trajectory import Trajectory
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater
from fulgor.types import agent_key

__all__ = ["AdapterUpdater", "rows_for"]

_SUMMED = ("trained_tokens", "optimizer_steps")


def rows_for(trajectories: Sequence[Trajectory], name: str, names: Sequence[str]) -> list[Trajectory]:
    """``trajectories`` with only the rows of the agents adapter ``name`` serves."""
    return [
        dataclasses.replace(
            trajectory,
            rows=[
                row
                for row in trajectory.rows
                if row.agent_name is not None and agent_key(names, row.agent_name) == name
            ],
        )
        for trajectory in trajectories
    ]


class AdapterUpdater:
    """Trains each named adapter of ``model`` (a peft model) on its own agents' rows."""

    def __init__(
        self, model: Any, config: GRPOConfig, names: Sequence[str], reference_model: Any | None = None
    ) -> None:
        self.model = model
        self.names = list(names)
        self.updaters: dict[str, PolicyUpdater] = {}
        for name in self.names:
            model.set_adapter(name)  # only this adapter's parameters require gradients now
            self.updaters[name] = PolicyUpdater(model, config, reference_model)

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update of each adapter that has rows; metrics per adapter (``loss/NAME`` style
        keys ``KEY/NAME``) and over all (token counts summed, the rest weighted by tokens)."""
        metrics: dict[str, float] = {}
        results: list[dict[str, float]] = []
        for name, updater in self.updaters.items():
            part = rows_for(trajectories, name, self.names)
            if not any(trajectory.rows for trajectory in part):
                continue
            self.model.set_adapter(name)
            result = updater.step(part)
            # Its gradients would otherwise count in the next adapter's gradient clipping.
            updater.optimizer.zero_grad(set_to_none=True)
            metrics.update({f"{key}/{name}": value for key, value in result.items()})
            results.append(result)
        tokens = sum(result["trained_tokens"] for result in results)
        for key in results[0] if results else ():
            if key in _SUMMED:
                metrics[key] = sum(result[key] for result in results)
            else:
                weights = [
                    result["trained_tokens"] / tokens if tokens else 1 / len(results) for result in results
                ]
                metrics[key] = sum(w * result[key] for w, result in zip(weights, results, strict=True))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {name: updater.state_dict() for name, updater in self.updaters.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, updater in self.updaters.items():
            updater.load_state_dict(state[name])
