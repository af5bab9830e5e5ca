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

An algorithm that improves the agent's resources instead (its prompts: :class:`~fulgor.APO`) is a
:class:`ResourceAlgorithm` (``publishes == "resources"``): it decides which rollouts to run with
which resources itself, through the :class:`RolloutSession` the Trainer hands it, one ``step`` at a
time; the Trainer owns the services, ``metrics.jsonl``, the trackers, the progress bar and resume
(a resumed run continues after the last step ``metrics.jsonl`` holds). It changes no weights, so it
runs on the local engine and on an upstream alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from fulgor.adapters.trajectory import Trajectory
from fulgor.types import LLM, JsonDict, Resource, Resources, Rollout, RolloutMode

if TYPE_CHECKING:
    from fulgor.store.base import Store
    from fulgor.weights.lora import LoraConfig

__all__ = [
    "Algorithm",
    "Publishes",
    "RecordingGateway",
    "ResourceAlgorithm",
    "RolloutResult",
    "RolloutSession",
    "Updater",
    "missing_members",
]

Publishes = Literal["weights", "nothing", "resources"]


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


class RolloutResult(Protocol):
    """An ended rollout and its reward (None when it emitted none)."""

    @property
    def rollout(self) -> Rollout: ...

    @property
    def reward(self) -> float | None: ...


class RecordingGateway(Protocol):
    """A gateway of the run's store in front of one model: each call made at ``base_url`` of a
    rollout's attempt (with ``api_key``) is recorded under that attempt like an agent's call."""

    @property
    def api_key(self) -> str: ...

    def base_url(self, rollout_id: str, attempt_id: str) -> str:
        """The OpenAI base URL (ending in ``/v1``) of one attempt."""
        ...

    async def settle(self, rollout_id: str) -> None:
        """Return once every call of ``rollout_id`` is in the store."""
        ...


class RolloutSession(Protocol):
    """What a :class:`ResourceAlgorithm` may ask of the Trainer while its services run."""

    run_dir: Path
    train: Sequence[Any]
    val: Sequence[Any]
    start_step: int
    """The last step an earlier session finished (0 for a new run): ``step`` continues after it."""

    @property
    def store(self) -> Store:
        """The run's store (where the algorithm may record rollouts of its own)."""
        ...

    async def run(
        self,
        tasks: Sequence[Any],
        resources: Mapping[str, Resource],
        mode: RolloutMode,
        *,
        step: int,
        sampling_parameters: JsonDict | None = None,
    ) -> Sequence[RolloutResult]:
        """One rollout of each task with ``resources`` (and the session's ``llm``, sampling as
        given), all at once; their outcomes in order, once every call of theirs is stored."""
        ...

    async def gateway_to(self, llm: LLM, *, timeout_seconds: float = 600.0) -> RecordingGateway:
        """A gateway of the run's store whose upstream is ``llm.endpoint`` (with its key, asked for
        no token ids), serving until the session ends: how an algorithm's own model calls (a
        critic's) are recorded like the agent's. It gives up on a call after ``timeout_seconds``."""
        ...


@runtime_checkable
class ResourceAlgorithm(Protocol):
    """An algorithm that publishes resources (prompts) instead of weights; see the module docstring."""

    name: str
    publishes: Literal["resources"]
    max_steps: int

    def hyperparameters(self) -> JsonDict: ...

    def sampling_parameters(self, mode: RolloutMode) -> JsonDict:
        """How the ``llm`` resource samples outside the search (``dev``: "test", ``evaluate``: "val")."""
        ...

    def resources(self, run_dir: Path) -> Resources:
        """What the agent runs with outside the search (``dev``, ``evaluate``, after ``fit``): the
        best found in ``run_dir`` so far, or what the search starts from."""
        ...

    async def prepare(self, session: RolloutSession) -> None:
        """Called once before the first step (a resumed run: after ``session.start_step``)."""
        ...

    async def step(self, session: RolloutSession, step: int) -> dict[str, float]:
        """One step of the search; its metrics, logged with the step."""
        ...

    async def close(self) -> None:
        """Called once after the last step, whatever happened (release what ``prepare`` started)."""
        ...

    def finished(self, elapsed_seconds: float) -> bool:
        """True once the search should stop before ``max_steps`` (a budget used up)."""
        ...


def missing_members(algorithm: object) -> list[str]:
    """The attributes and methods that ``algorithm`` lacks, sorted: those of
    :class:`ResourceAlgorithm` when it publishes resources, else those of :class:`Algorithm`."""
    kind: type = ResourceAlgorithm if getattr(algorithm, "publishes", None) == "resources" else Algorithm
    members = set(kind.__annotations__)
    members |= {
        name
        for name, value in vars(kind).items()
        if (callable(value) or isinstance(value, property)) and not name.startswith("_")
    }
    return sorted(name for name in members if not hasattr(algorithm, name))
