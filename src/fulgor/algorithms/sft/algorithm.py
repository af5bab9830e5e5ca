"""SFT as the trainer runs it: imitate the best of the agent's own rollouts, or another model's.

Two sources of what to imitate, one update (:class:`~fulgor.algorithms.sft.update.SFTUpdater`):

* **Rejection sampling** (expert iteration; the default): each step runs ``group_size`` rollouts of
  each of ``batch_tasks`` tasks, keeps the trajectories the rule selects (reward at least
  ``min_reward``; the best ``top_k`` of each group; both, when both are given) and fine-tunes on
  exactly the tokens the engine sampled in them: loss on sampled tokens only, prompts and tool
  results as context, nothing re-tokenised. It publishes the weights as GRPO does, and repeats.
* **Distillation** (``from_run``): the rollouts of a teacher run (a run directory, SQLite file or
  store whose calls went through the gateway to a stronger model) become chat transcripts
  (:mod:`fulgor.adapters.transcripts`), selected by the same rule, rendered with the student's chat
  template (:mod:`fulgor.algorithms.sft.distill`: the one place text is tokenised for training;
  ``rows_tokenised`` counts them per step) and learned ``batch_size`` at a time, in shuffled passes.
  Steps run no rollouts; validation runs as usual.

What it does not know: stores of its own run, gateways, engines or runners (the trainer wires those).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.adapters.trajectory import Trajectory
from fulgor.algorithms.base import Publishes
from fulgor.algorithms.schedule import StepSchedule, shuffled_index
from fulgor.algorithms.sft.update import SFTConfig
from fulgor.errors import ConfigError
from fulgor.store.base import Store
from fulgor.types import JsonDict

if TYPE_CHECKING:
    from fulgor.algorithms.sft.distill import TeacherData
    from fulgor.algorithms.sft.update import SFTUpdater
    from fulgor.weights.lora import LoraConfig

__all__ = ["SFT", "select_best"]

logger = logging.getLogger(__name__)

_REASONS_LOGGED = 20


class SFT(StepSchedule):
    """Supervised fine-tuning on selected trajectories: the agent's own best, or a teacher's.

    Rejection sampling needs a rule: ``min_reward``, ``top_k`` or both (``top_k`` at most
    ``group_size``). ``from_run`` distils a teacher run's rollouts instead (the rule, if any, picks
    among them). ``config`` (:class:`SFTConfig`) sets the learning rate and micro-batches; with
    ``lora`` only an adapter trains. ``max_steps``, ``max_seconds``, ``val_every``,
    ``val_before_training``, the sampling settings, ``agent_match``, ``max_trajectory_tokens`` and
    ``seed`` behave as GRPO's.
    """

    name: str = "sft"
    publishes: Publishes = "weights"
    async_rollouts: bool = False
    metric_names: Mapping[str, str] = {
        "loss": "loss",
        "grad_norm": "grad_norm",
        "trained_tokens": "trained_tokens",
    }

    def __init__(
        self,
        *,
        min_reward: float | None = None,
        top_k: int | None = None,
        from_run: str | Path | Store | None = None,
        group_size: int = 8,
        batch_tasks: int = 8,
        batch_size: int = 32,
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
        config: SFTConfig | None = None,
        lora: LoraConfig | None = None,
    ) -> None:
        self.min_reward = min_reward
        self.top_k = top_k
        self.from_run = from_run
        self.group_size = group_size
        self.batch_tasks = batch_tasks
        self.batch_size = batch_size
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
        self.config = config or SFTConfig()
        self.lora = lora
        self.teacher: TeacherData | None = None
        self._step = 0
        self._validate()

    def _validate(self) -> None:
        self.check_schedule(counts=("batch_size",))
        if self.from_run is None and self.min_reward is None and self.top_k is None:
            raise ConfigError(
                "SFT needs to know what to imitate: min_reward=R (keep rollouts with reward >= R), "
                "top_k=K (the best K of each group), both, or from_run=DIR (a teacher run's rollouts)"
            )
        if self.top_k is not None and not 1 <= self.top_k <= self.group_size:
            raise ConfigError(f"SFT top_k must be from 1 to group_size ({self.group_size}), got {self.top_k}")

    def __repr__(self) -> str:
        source = f"from_run={self.from_run!r}" if self.distilling else f"group_size={self.group_size}"
        return (
            f"SFT({source}, min_reward={self.min_reward}, top_k={self.top_k}, max_steps={self.max_steps}, "
            f"config={self.config}, lora={self.lora})"
        )

    @property
    def distilling(self) -> bool:
        return self.from_run is not None

    @property
    def needs_reference_model(self) -> bool:
        return False

    def hyperparameters(self) -> JsonDict:
        """The run's settings as plain values (what a metrics tracker records with the run)."""
        names: tuple[str, ...] = ("min_reward", "top_k", "max_steps", "max_seconds", "val_every", "seed")
        names += ("batch_size",) if self.distilling else ("group_size", "batch_tasks", "temperature", "top_p")
        settings: JsonDict = {"algorithm": "sft", **{name: getattr(self, name) for name in names}}
        settings["source"] = "distillation" if self.distilling else "rejection_sampling"
        if self.distilling and not isinstance(self.from_run, Store):
            settings["from_run"] = str(self.from_run)
        settings["max_tokens"] = self.max_tokens
        settings["max_trajectory_tokens"] = self.max_trajectory_tokens
        settings["agent_match"] = self.agent_match
        settings.update({f"config/{k}": v for k, v in dataclasses.asdict(self.config).items()})
        if self.lora is not None:
            settings.update({f"lora/{k}": v for k, v in dataclasses.asdict(self.lora).items()})
        return settings

    async def prepare(self, policy: Any | None) -> None:
        """Distilling: read the teacher run and render its selected transcripts with the student's
        chat template (``policy.tokenizer``); a ConfigError that says why, per rollout, when none
        can be used."""
        if not self.distilling:
            return
        import asyncio

        from fulgor.algorithms.sft.distill import read_teacher, teacher_data
        from fulgor.weights.loading import eos_token_ids

        assert self.from_run is not None
        assert policy is not None
        found = await read_teacher(self.from_run, agent_match=self.agent_match)
        chosen = _select_transcripts(found, self.min_reward, self.top_k)
        stops = eos_token_ids(policy.model, policy.tokenizer)
        self.teacher = await asyncio.to_thread(
            teacher_data,
            chosen,
            policy.tokenizer,
            stop_token_ids=stops,
            max_tokens=self.max_trajectory_tokens,
        )
        logger.info("distilling from %s: %s", self.from_run, self.teacher.summary())
        for item in self.teacher.unusable[:_REASONS_LOGGED]:
            logger.info("  not used: rollout %s: %s", item.rollout_id, item.reason)
        if not self.teacher.trajectories:
            listed = "\n".join(
                f"  {u.rollout_id}: {u.reason}" for u in self.teacher.unusable[:_REASONS_LOGGED]
            )
            more = len(self.teacher.unusable) - _REASONS_LOGGED
            raise ConfigError(
                f"the teacher run {self.from_run} has no transcript the student can learn "
                f"({self.teacher.summary()}):\n{listed}" + (f"\n  ... and {more} more" if more > 0 else "")
            )

    def step_tasks(self, dataset: Sequence[Any], step: int) -> list[Any]:
        """The ``batch_tasks`` tasks of ``step`` (as GRPO's); none when distilling."""
        self._step = step
        return [] if self.distilling else super().step_tasks(dataset, step)

    def select(
        self, trajectories: list[Trajectory], policy_version: int
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Rejection sampling: the trajectories the rule keeps, counted as ``rollouts_selected`` and
        ``rollouts_not_selected``. Distilling: the step's ``batch_size`` teacher transcripts."""
        if not self.distilling:
            kept = select_best(trajectories, self.min_reward, self.top_k)
            counts = {
                "rollouts_selected": float(len(kept)),
                "rollouts_not_selected": float(len(trajectories) - len(kept)),
            }
            return kept, counts
        if self.teacher is None:
            raise ConfigError(
                "SFT(from_run=...) was not prepared: the Trainer calls prepare() before the first step"
            )
        pool = self.teacher.trajectories
        start = (self._step - 1) * self.batch_size
        batch = [pool[shuffled_index(len(pool), p, self.seed)] for p in range(start, start + self.batch_size)]
        counts = {
            "rows_tokenised": float(sum(len(t.rows) for t in batch)),
            "transcripts": float(len(pool)),
            "transcripts_not_used": float(len(self.teacher.unusable)),
        }
        return batch, counts

    def updater(self, model: Any, reference_model: Any | None = None) -> SFTUpdater:
        """The fine-tuning updater (optimiser included) that trains ``model`` in place."""
        from fulgor.algorithms.sft.update import SFTUpdater

        return SFTUpdater(model, self.config)


def select_best(items: Sequence[Any], min_reward: float | None, top_k: int | None) -> list[Any]:
    """Those of ``items`` (anything with ``reward`` and ``group_id``) with reward >= ``min_reward``,
    then the ``top_k`` best of each group (ties: the earlier first); in their order.

    >>> from types import SimpleNamespace as T
    >>> items = [T(group_id="a", reward=r) for r in (0.0, 1.0, 0.5)] + [T(group_id="b", reward=0.2)]
    >>> [i.reward for i in select_best(items, None, 1)], [i.reward for i in select_best(items, 0.5, None)]
    ([1.0, 0.2], [1.0, 0.5])
    """
    kept = [item for item in items if min_reward is None or item.reward >= min_reward]
    if top_k is None:
        return kept
    groups: dict[Any, list[int]] = {}
    for index, item in enumerate(kept):
        groups.setdefault(item.group_id if item.group_id is not None else ("alone", index), []).append(index)
    chosen: set[int] = set()
    for indices in groups.values():
        chosen.update(sorted(indices, key=lambda i: (-kept[i].reward, i))[:top_k])
    return [item for index, item in enumerate(kept) if index in chosen]


def _select_transcripts(found: Sequence[Any], min_reward: float | None, top_k: int | None) -> list[Any]:
    """The teacher's transcripts the rule keeps (a rollout's transcripts are kept or left together,
    by its reward) and every unusable rollout, to be reported."""
    from fulgor.adapters.transcripts import Transcript, Unusable

    transcripts = [item for item in found if isinstance(item, Transcript)]
    rollouts = list({t.rollout_id: t for t in transcripts}.values())  # one per rollout, for the rule
    kept = {t.rollout_id for t in select_best(rollouts, min_reward, top_k)}
    left = [
        Unusable(t.rollout_id, "its reward is not among those the rule selects (min_reward, top_k)")
        for t in rollouts
        if t.rollout_id not in kept
    ]
    return (
        [item for item in found if isinstance(item, Unusable)]
        + left
        + [t for t in transcripts if t.rollout_id in kept]
    )
