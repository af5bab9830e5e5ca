"""GRPO as the trainer runs it: how many rollouts per task, which tasks each step, how to sample.

``GRPO`` holds the run's hyperparameters (keyword-only, validated early) and answers the questions
the trainer asks of an algorithm (:class:`~fulgor.algorithms.base.Algorithm`): the tasks of step N,
the sampling parameters for training and for validation, which trajectories to learn from, and the
policy updater for a model. The update itself (advantages, clipped loss,
optimiser step) lives in :mod:`fulgor.algorithms.grpo.update`.

What it does not know: stores, gateways, engines or runners (the trainer wires those).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fulgor.adapters.trajectory import Trajectory
from fulgor.algorithms.base import Publishes
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.schedule import StepSchedule
from fulgor.errors import ConfigError
from fulgor.types import JsonDict

if TYPE_CHECKING:
    from fulgor.algorithms.grpo.adapters import AdapterUpdater
    from fulgor.algorithms.grpo.update import PolicyUpdater
    from fulgor.weights.lora import LoraConfig

__all__ = ["GRPO"]

logger = logging.getLogger(__name__)

_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class GRPO(StepSchedule):
    """Group Relative Policy Optimisation over an agent's own rollouts.

    Each step samples ``group_size`` rollouts for each of ``batch_tasks`` training tasks (one
    GRPO group per task), turns them into trajectories and applies one policy update with
    ``config`` (learning rate, advantage estimator, clipping, KL; see :class:`GRPOConfig`). Every
    ``val_every`` steps each validation task runs once with greedy sampling (temperature 0), and
    once before the first step with ``val_before_training`` (the curve's starting point).
    ``max_seconds`` bounds the run's wall time as well: training stops after the step that ends
    past it (the run's ``elapsed_seconds``, earlier sessions of a resumed run included), and that
    step validates. Tasks are drawn from a shuffled pass over the training set (reshuffled each
    pass, by ``seed``). It publishes new weights after every step.
    ``max_trajectory_tokens`` truncates longer token rows (counted as drift). With ``lora``
    (:class:`~fulgor.weights.lora.LoraConfig`) only a low-rank adapter over the weights trains,
    and each step publishes just the adapter. With ``adapters`` (a name and a ``LoraConfig`` each:
    ``{"write": LoraConfig(), "rewrite": LoraConfig()}``) one frozen base carries one adapter per
    agent of a multi-agent system: an agent whose name starts with an adapter's name (the longest
    one) is served by that adapter and trains it alone; other agents are served by the base and not
    trained (``agent_match`` is implied). With ``async_rollouts`` step N+1's rollouts run while
    step N's update trains, on the weights published before it; trajectories more than
    ``max_staleness`` weight versions behind the policy they would update are dropped (and counted).
    """

    name: str = "grpo"
    publishes: Publishes = "weights"
    # The updater's metrics, under the names metrics.jsonl gives them.
    metric_names: Mapping[str, str] = {
        "policy_loss": "loss",
        "entropy": "entropy",
        "clip_fraction": "clip_fraction",
        "importance_weight_mean": "importance_weight_mean",
        "kl": "kl",
        "grad_norm": "grad_norm",
        "trained_tokens": "trained_tokens",
    }

    def __init__(
        self,
        *,
        group_size: int = 8,
        batch_tasks: int = 8,
        max_steps: int = 100,
        max_seconds: float | None = None,
        val_every: int = 10,
        val_before_training: bool = True,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 256,
        max_trajectory_tokens: int | None = None,
        agent_match: str | None = None,
        seed: int = 0,
        config: GRPOConfig | None = None,
        lora: LoraConfig | None = None,
        adapters: Mapping[str, LoraConfig] | None = None,
        async_rollouts: bool = False,
        max_staleness: int = 1,
    ) -> None:
        self.group_size = group_size
        self.batch_tasks = batch_tasks
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.val_every = val_every
        self.val_before_training = val_before_training
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.max_trajectory_tokens = max_trajectory_tokens
        self.agent_match = agent_match
        self.seed = seed
        self.config = config or GRPOConfig()
        self.lora = lora
        self.adapters = dict(adapters or {})
        self.async_rollouts = async_rollouts
        self.max_staleness = max_staleness
        self._validate()

    def _validate(self) -> None:
        self.check_schedule()
        if self.adapters:
            self._use_adapters()
        if self.group_size < 2:
            raise ConfigError(
                "GRPO group_size must be >= 2 (advantages compare the rollouts of one task), "
                f"got {self.group_size}"
            )
        if self.max_staleness < 0:
            raise ConfigError(
                f"max_staleness must be >= 0 (0 trains only on rollouts of the current weights), "
                f"got {self.max_staleness}"
            )

    def _use_adapters(self) -> None:
        """Check ``adapters`` and take the agents they serve as ``agent_match``."""
        if self.lora is not None:
            raise ConfigError(
                "GRPO takes lora= (one adapter for every agent) or adapters= (one per agent), not both"
            )
        if self.agent_match is not None:
            raise ConfigError(
                "GRPO(adapters=...) trains the agents its adapters serve; leave agent_match unset "
                f"(got {self.agent_match!r})"
            )
        for name in self.adapters:
            if not _ADAPTER_NAME.fullmatch(name):
                raise ConfigError(
                    f"adapter name {name!r} must be letters, digits, '_', '-' or '.' (it names the adapter's "
                    "model and folder, and the start of the agent names it serves, e.g. 'write')"
                )
        longest_first = sorted(self.adapters, key=len, reverse=True)
        self.agent_match = "^(?:" + "|".join(re.escape(name) for name in longest_first) + ")"
        self.metric_names = {
            **type(self).metric_names,
            **{
                f"{key}/{name}": f"{value}/{name}"
                for name in self.adapters
                for key, value in GRPO.metric_names.items()
            },
        }

    def __repr__(self) -> str:
        return (
            f"GRPO(group_size={self.group_size}, batch_tasks={self.batch_tasks}, max_steps={self.max_steps}, "
            f"val_every={self.val_every}, temperature={self.temperature}, max_tokens={self.max_tokens}, "
            f"config={self.config}, lora={self.lora}, adapters={self.adapters or None})"
        )

    def hyperparameters(self) -> JsonDict:
        """The run's settings as plain values (what a metrics tracker records with the run)."""
        names = ("group_size", "batch_tasks", "max_steps", "val_every", "temperature", "top_p", "max_tokens")
        settings: JsonDict = {"algorithm": "grpo", **{name: getattr(self, name) for name in names}}
        settings["max_seconds"] = self.max_seconds
        settings["max_trajectory_tokens"] = self.max_trajectory_tokens
        settings["agent_match"] = self.agent_match
        settings["seed"] = self.seed
        settings.update({f"config/{k}": v for k, v in dataclasses.asdict(self.config).items()})
        if self.lora is not None:
            settings.update({f"lora/{k}": v for k, v in dataclasses.asdict(self.lora).items()})
        for name, shape in self.adapters.items():
            settings.update({f"adapters/{name}/{k}": v for k, v in dataclasses.asdict(shape).items()})
        if self.async_rollouts:
            settings.update(async_rollouts=True, max_staleness=self.max_staleness)
        return settings

    async def prepare(self, policy: Any | None) -> None:
        """Nothing to prepare: GRPO learns from each step's own rollouts."""

    def split_stale(
        self, trajectories: Sequence[Trajectory], policy_version: int
    ) -> tuple[list[Trajectory], list[Trajectory]]:
        """The trajectories to train the policy at ``policy_version`` on, and the stale ones.

        A trajectory is as old as its oldest model call; it is stale when that call ran more than
        ``max_staleness`` versions before ``policy_version``, or names no version (its age is
        unknown). Only asynchronous rollouts can be stale: synchronous ones all ran on the policy.

        >>> def ran_on(*versions): return Trajectory("r", "g", 1.0, [], model_versions=list(versions))
        >>> fresh, stale = GRPO(async_rollouts=True, max_staleness=1).split_stale(
        ...     [ran_on(4), ran_on(3, 4), ran_on(2, 4), ran_on(None)], policy_version=4)
        >>> [t.model_versions for t in fresh], [t.model_versions for t in stale]
        ([[4], [3, 4]], [[2, 4], [None]])
        """
        if not self.async_rollouts:
            return list(trajectories), []
        fresh, stale = [], []
        for trajectory in trajectories:
            known = [v for v in trajectory.model_versions if v is not None]
            complete = bool(known) and len(known) == len(trajectory.model_versions)
            if complete and policy_version - min(known) <= self.max_staleness:
                fresh.append(trajectory)
            else:
                stale.append(trajectory)
        return fresh, stale

    @property
    def needs_reference_model(self) -> bool:
        """A KL penalty compares the policy with the starting weights."""
        return self.config.kl_coef > 0

    def select(
        self, trajectories: list[Trajectory], policy_version: int
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Every trajectory but the stale ones (:meth:`split_stale`), counted as ``rollouts_stale``
        when rollouts run asynchronously."""
        fresh, stale = self.split_stale(trajectories, policy_version)
        if stale:
            logger.info("%d rollouts ran on weights too old for version %d", len(stale), policy_version)
        return fresh, ({"rollouts_stale": float(len(stale))} if self.async_rollouts else {})

    def updater(self, model: Any, reference_model: Any | None = None) -> PolicyUpdater | AdapterUpdater:
        """The policy updater (optimiser included) that trains ``model`` in place; with ``adapters``,
        one per adapter of ``model``."""
        from fulgor.algorithms.grpo.adapters import AdapterUpdater
        from fulgor.algorithms.grpo.update import PolicyUpdater

        if self.config.kl_coef > 0 and reference_model is None:
            raise ConfigError("kl_coef > 0 needs a reference model; set kl_coef=0 or pass one")
        if self.adapters:
            return AdapterUpdater(model, self.config, list(self.adapters), reference_model)
        return PolicyUpdater(model, self.config, reference_model=reference_model)
