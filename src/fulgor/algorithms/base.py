"""The Algorithm protocol: what a Trainer step asks of an algorithm, and nothing more.

The :class:`~fulgor.training.Trainer` owns the services (store, gateway, engine, runners), the
trainer's copy of the weights, checkpoints, validation, metrics, trackers, the report and resume;
an algorithm owns the decisions. Before the first step of ``Trainer.fit``, ``prepare(policy)`` gets
the trainer's copy of the model (``policy.model``, ``policy.tokenizer``; None when the algorithm
publishes nothing): an algorithm that trains on data of its own (SFT on another model's
transcripts) reads and renders it there. Then each step:

1. **Which tasks, how many rollouts of each, with which resources**: ``step_tasks(train, step)``
   are the step's tasks, each run ``group_size`` times as one group, with the model resource
   sampling as ``sampling_parameters("train")`` says (validation uses ``sampling_parameters("val")``).
   No tasks: the step runs no rollouts.
2. **What to do with finished rollouts**: their model calls become token rows (the calls of
   ``agent_match`` only, rows cut at ``max_trajectory_tokens``); ``select(trajectories,
   policy_version)`` returns those to learn from (the step's own, or any others) and counts to log
   with them; when it returns none, the step takes no update and logs ``update_skipped``.
3. **What to publish**: with ``publishes == "weights"``, the trainer loads a trainable copy of the
   model (a LoRA adapter over it with ``lora``), asks ``updater(model, reference_model)`` for an
   :class:`Updater` (a frozen copy of the starting weights as ``reference_model`` when
   ``needs_reference_model``), runs ``Updater.step`` on the selected trajectories, saves a
   checkpoint (weights and ``Updater.state_dict()``, which a resumed run hands back to
   ``load_state_dict``) and swaps it into the engine. With ``"nothing"``, the step only runs and
   measures rollouts.
4. **Metrics and hyperparameters**: ``hyperparameters()`` go to the trackers once;
   ``metric_names`` maps the updater's metrics to the names logged in ``metrics.jsonl``.
5. **When to stop, when to validate**: after ``max_steps`` steps, or the step after which
   ``out_of_time(elapsed_seconds)`` holds; validation before the first step with
   ``val_before_training`` and after each step where ``validates_at(step)``. With
   ``async_rollouts`` the next step's rollouts run while this step's update trains.

:class:`~fulgor.algorithms.grpo.GRPO` is one implementation; any object with these attributes and
methods is another (the protocol is structural: nothing needs to subclass it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from fulgor.adapters.trajectory import Trajectory
from fulgor.types import JsonDict, RolloutMode

if TYPE_CHECKING:
    from fulgor.algorithms.lora import LoraConfig

__all__ = ["Algorithm", "Publishes", "Updater", "missing_members"]

Publishes = Literal["weights", "nothing"]


@runtime_checkable
class Updater(Protocol):
    """Trains a model in place, one step at a time, and carries its state across sessions."""

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update on ``trajectories``; returns its metrics (see ``Algorithm.metric_names``)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps for a resumed run (an optimiser's state, say)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what :meth:`state_dict` returned in an earlier session."""
        ...


@runtime_checkable
class Algorithm(Protocol):
    """What the Trainer asks of an algorithm; see the module's docstring for when it asks."""

    name: str
    """Short and lower case (``grpo``): logged with the hyperparameters, named in errors."""
    publishes: Publishes
    group_size: int
    max_steps: int
    val_before_training: bool
    async_rollouts: bool
    agent_match: str | None
    max_trajectory_tokens: int | None
    lora: LoraConfig | None
    metric_names: Mapping[str, str]

    @property
    def needs_reference_model(self) -> bool: ...

    def hyperparameters(self) -> JsonDict: ...

    async def prepare(self, policy: Any | None) -> None: ...

    def sampling_parameters(self, mode: RolloutMode) -> JsonDict: ...

    def step_tasks(self, dataset: Sequence[Any], step: int) -> list[Any]: ...

    def select(
        self, trajectories: list[Trajectory], policy_version: int
    ) -> tuple[list[Trajectory], dict[str, float]]: ...

    def updater(self, model: Any, reference_model: Any | None = None) -> Updater: ...

    def validates_at(self, step: int) -> bool: ...

    def out_of_time(self, elapsed_seconds: float) -> bool: ...


def missing_members(algorithm: object) -> list[str]:
    """The attributes and methods of :class:`Algorithm` that ``algorithm`` lacks, sorted."""
    members = set(Algorithm.__annotations__)
    members |= {
        name
        for name, value in vars(Algorithm).items()
        if (callable(value) or isinstance(value, property)) and not name.startswith("_")
    }
    return sorted(name for name in members if not hasattr(algorithm, name))
