"""The search of prompt optimisation: beam search over textual gradients, or a Pareto front.

One **proposal** runs a parent candidate on a minibatch of training tasks, shows those rollouts to
the critic with one of the parent's prompts (the prompts take turns), and asks the editor to
rewrite that prompt following the critique; an answer that is not a usable template is a rejected
candidate with its reason. One **step** of

- ``beam`` (Agent Lightning's APO): samples ``beam_width`` parents from the beam, makes
  ``branch_factor`` proposals from each (each on a minibatch of its own), scores the beam and
  the new candidates on the next validation batch, keeps the best ``beam_width``, and scores the
  leader on the whole validation set; it becomes the best when it beats the best so far;
- ``pareto`` (GEPA): makes ``proposals_per_step`` proposals, each from a parent sampled among
  the candidates best on at least one validation task (weighted by how many), and keeps a child
  only when it beats its parent on the minibatch the critique came from (then scores it on the
  whole validation set). A parent that already scores 1 on its minibatch is not edited.

An edit that gives prompts another candidate already has is rejected before it runs.

A candidate's reward on a validation task is measured once (validation is greedy) and reused.
Proposals and scorings of one step run at once; the answers are read in the order the proposals
were planned, so a seed gives the same search when the models answer alike. Budgets: before each
proposal and each scoring, the rollouts and optimiser calls it needs must fit in what is left; once
one does not, the step ends with what it has and the search is finished.

What it does not know: the services (a :class:`~fulgor.algorithms.base.RolloutSession` runs the
rollouts) or where the history is written.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from fulgor.algorithms.apo.candidates import Candidate, pareto_weights, read_edit
from fulgor.algorithms.apo.messages import critic_messages, editor_messages, rollout_view
from fulgor.algorithms.apo.optimizer import OptimizerCalls
from fulgor.algorithms.base import RolloutSession
from fulgor.types import JsonDict

__all__ = ["Search", "SearchSettings"]


@dataclass(frozen=True)
class _Draft:
    """What one proposal brought back: the parent's minibatch, its total, the critique, the answer."""

    parent: Candidate
    name: str
    batch: list[Any]
    parent_total: float
    critique: str
    answer: str


@dataclass(frozen=True)
class SearchSettings:
    mode: str
    beam_width: int
    branch_factor: int
    proposals_per_step: int
    gradient_batch_size: int
    val_batch_size: int
    max_rollouts: int | None
    max_optimizer_calls: int | None
    train_sampling: JsonDict
    val_sampling: JsonDict
    seed: int


@dataclass
class Search:
    """The search's state (every candidate, the beam, the best, what was used) and its steps."""

    settings: SearchSettings
    candidates: dict[str, Candidate]
    beam: list[str]
    best: str
    rng: random.Random
    rollouts: int = 0
    optimizer_calls: int = 0
    best_rollouts: int = 0
    best_optimizer_calls: int = 0
    budget_spent: bool = False
    train_position: int = 0
    val_position: int = 0
    turn: int = 0
    _step_counts: dict[str, int] = field(default_factory=dict)

    # -- steps --------------------------------------------------------------------------------------

    async def seed_scores(self, session: RolloutSession) -> None:
        """Score the starting candidate on the whole validation set (the baseline to beat)."""
        await self.score(session, 0, [self.candidates[self.best]], _all(session.val))
        self.best_rollouts = self.rollouts

    async def step(self, session: RolloutSession, calls: OptimizerCalls, step: int) -> dict[str, float]:
        self._step_counts = {"candidates": 0, "rejected": 0, "proposals_skipped": 0, "proposals_failed": 0}
        calls.reset()
        failures = calls.failures
        if self.settings.mode == "beam":
            await self._beam_step(session, calls, step)
        else:
            await self._pareto_step(session, calls, step)
        best = self.candidates[self.best]
        return {
            "best_score": best.score() or 0.0,
            "candidates": self._step_counts["candidates"],
            "candidates_rejected": self._step_counts["rejected"],
            "proposals_skipped": self._step_counts["proposals_skipped"],
            "proposals_failed": self._step_counts["proposals_failed"],
            "optimizer_failures": calls.failures - failures,
            "rollouts_total": self.rollouts,
            "optimizer_calls_total": self.optimizer_calls,
            "best_rollouts": self.best_rollouts,
            "best_optimizer_calls": self.best_optimizer_calls,
        }

    async def _beam_step(self, session: RolloutSession, calls: OptimizerCalls, step: int) -> None:
        settings = self.settings
        beam = [self.candidates[i] for i in self.beam]
        parents = (
            [beam[i % len(beam)] for i in range(settings.beam_width)]
            if len(beam) < settings.beam_width
            else self.rng.sample(beam, settings.beam_width)
        )
        plans = [
            (parent, self._train_batch(session)) for parent in parents for _ in range(settings.branch_factor)
        ]
        children = await self._propose_all(session, calls, step, plans, gate=False)
        pool = beam + children
        batch = self._val_batch(session)
        await self.score(session, step, pool, batch)
        keys = [str(i) for i in batch]
        ranked = sorted(
            (c for c in pool if all(k in c.val_scores for k in keys)), key=lambda c: -(c.score(keys) or 0.0)
        )
        if not ranked:
            return
        self.beam = [c.id for c in ranked[: settings.beam_width]]
        for candidate in pool:
            candidate.status = "kept" if candidate.id in self.beam else "dropped"
        leader = ranked[0]
        await self.score(session, step, [leader], _all(session.val))
        self._maybe_best(leader, len(session.val))

    async def _pareto_step(self, session: RolloutSession, calls: OptimizerCalls, step: int) -> None:
        weights = pareto_weights({c.id: c.val_scores for c in self._scored()})
        ids = sorted(weights)
        parents = self.rng.choices(ids, weights=[weights[i] for i in ids], k=self.settings.proposals_per_step)
        plans = [(self.candidates[p], self._train_batch(session)) for p in parents]
        children = await self._propose_all(session, calls, step, plans, gate=True, scoring=len(session.val))
        everything = _all(session.val)
        await self.score(session, step, children, everything)
        for child in children:
            self._maybe_best(child, len(session.val))

    # -- proposals ----------------------------------------------------------------------------------

    async def _propose_all(
        self,
        session: RolloutSession,
        calls: OptimizerCalls,
        step: int,
        plans: Sequence[tuple[Candidate, list[Any]]],
        *,
        gate: bool,
        scoring: int = 0,
    ) -> list[Candidate]:
        """The step's proposals, run at once; their answers are read in the order of ``plans``
        (candidates numbered, twins found, the same on every run), then the gated children run.
        A proposal starts only when its rollouts fit in the budget, ``scoring`` (what scoring the
        child it may make takes) included."""
        runs: list[Coroutine[Any, Any, _Draft | None]] = []
        for parent, batch in plans:
            rollouts = len(batch) * (2 if gate else 1) + scoring
            if not self._fits(rollouts, 2):
                self._step_counts["proposals_skipped"] += len(plans) - len(runs)
                break
            self.rollouts += rollouts  # reserved now: proposals run at once
            self.optimizer_calls += 2
            runs.append(self._draft(session, calls, step, parent, self._next_prompt(parent), batch, gate))
        children = [
            (child, draft)
            for draft in await asyncio.gather(*runs)
            if draft is not None and (child := self._child(step, draft, gate)) is not None
        ]
        if gate:
            kept = await asyncio.gather(
                *(self._beats_parent(session, step, child, draft) for child, draft in children)
            )
            children = [pair for pair, beats in zip(children, kept, strict=True) if beats]
        self.rollouts -= scoring * len(runs)  # reserved for the budget check; scoring counts its own
        return [child for child, _ in children]

    async def _draft(
        self,
        session: RolloutSession,
        calls: OptimizerCalls,
        step: int,
        parent: Candidate,
        name: str,
        batch: list[Any],
        gate: bool,
    ) -> _Draft | None:
        """The parent on its minibatch, the critique of those rollouts and the editor's answer;
        None when the parent is perfect there (gated) or the optimiser did not answer."""
        outcomes = await session.run(
            batch, parent.prompts, "train", step=step, sampling_parameters=self.settings.train_sampling
        )
        parent_total = sum(o.reward or 0.0 for o in outcomes)
        if gate and parent_total >= len(batch):
            self.rollouts -= len(batch)  # the child's rollouts were reserved, not run
            self.optimizer_calls -= 2
            self._step_counts["proposals_skipped"] += 1
            return None
        views = [await rollout_view(session.store, o.rollout.rollout_id, o.rollout.status) for o in outcomes]
        where = {"step": step, "parent": parent.id, "prompt": name}
        critique, tries = await calls.ask("critic", critic_messages(name, parent.prompts, views), where)
        answer = None
        if critique is not None:
            answer, more = await calls.ask(
                "editor", editor_messages(name, parent.prompts[name], critique), where
            )
            tries += more
        self.optimizer_calls += tries - 2  # retries count too; two were reserved
        if critique is None or answer is None:
            self.rollouts -= len(batch) if gate else 0
            self._step_counts["proposals_failed"] += 1
            return None
        return _Draft(parent, name, batch, parent_total, critique, answer)

    def _child(self, step: int, draft: _Draft, gate: bool) -> Candidate | None:
        """The candidate the editor's answer makes; None (and a rejected candidate, with its
        reason) when the answer is no usable template or gives prompts a candidate already has."""
        child = self._new_candidate(step, draft.parent, draft.name, draft.critique)
        template, problem = read_edit(draft.parent.prompts[draft.name], draft.answer)
        if template is not None:
            child.prompts[draft.name] = template
            twin = next((c for c in self._scored_or_pending(child) if c.prompts == child.prompts), None)
            # A twin's scores are known (or being measured): there is nothing new to learn.
            problem = None if twin is None else f"its prompts are those of {twin.id}"
        if problem is None:
            return child
        child.status, child.reason = "rejected", problem
        self._step_counts["rejected"] += 1
        self.rollouts -= len(draft.batch) if gate else 0
        return None

    async def _beats_parent(
        self, session: RolloutSession, step: int, child: Candidate, draft: _Draft
    ) -> bool:
        """Run ``child`` on its parent's minibatch: kept only when it scores higher there."""
        outcomes = await session.run(
            draft.batch, child.prompts, "train", step=step, sampling_parameters=self.settings.train_sampling
        )
        child_total, parent_total, size = (
            sum(o.reward or 0.0 for o in outcomes),
            draft.parent_total,
            len(draft.batch),
        )
        child.minibatch = {"parent": parent_total / size, "child": child_total / size}
        if child_total > parent_total:
            return True
        child.status = "rejected"
        child.reason = (
            f"it did not beat its parent on the minibatch ({child_total:g} vs {parent_total:g} of {size})"
        )
        self._step_counts["rejected"] += 1
        return False

    def _new_candidate(self, step: int, parent: Candidate, name: str, critique: str | None) -> Candidate:
        child = Candidate(
            id=f"c{len(self.candidates):04d}",
            prompts=dict(parent.prompts),
            step=step,
            parent=parent.id,
            edited=name,
            critique=critique,
        )
        self.candidates[child.id] = child
        self._step_counts["candidates"] += 1
        return child

    # -- scoring ------------------------------------------------------------------------------------

    async def score(
        self, session: RolloutSession, step: int, pool: Sequence[Candidate], indices: Sequence[int]
    ) -> None:
        """Run each candidate on the validation tasks of ``indices`` it has not run yet."""
        runs = []
        for candidate in pool:
            missing = [i for i in indices if str(i) not in candidate.val_scores]
            if not missing:
                continue
            if not self._fits(len(missing), 0):
                break
            self.rollouts += len(missing)
            runs.append(self._score_one(session, step, candidate, missing))
        await asyncio.gather(*runs)

    async def _score_one(
        self, session: RolloutSession, step: int, candidate: Candidate, indices: list[int]
    ) -> None:
        tasks = [session.val[i] for i in indices]
        outcomes = await session.run(
            tasks, candidate.prompts, "val", step=step, sampling_parameters=self.settings.val_sampling
        )
        for index, outcome in zip(indices, outcomes, strict=True):
            candidate.val_scores[str(index)] = outcome.reward or 0.0

    def _maybe_best(self, candidate: Candidate, tasks: int) -> None:
        score = candidate.score()
        if len(candidate.val_scores) < tasks or score is None:
            return
        if score > (self.candidates[self.best].score() or 0.0):
            self.best = candidate.id
            self.best_rollouts, self.best_optimizer_calls = self.rollouts, self.optimizer_calls

    # -- helpers ------------------------------------------------------------------------------------

    def _fits(self, rollouts: int, optimizer_calls: int) -> bool:
        settings = self.settings
        over = (settings.max_rollouts is not None and self.rollouts + rollouts > settings.max_rollouts) or (
            settings.max_optimizer_calls is not None
            and self.optimizer_calls + optimizer_calls > settings.max_optimizer_calls
        )
        self.budget_spent = self.budget_spent or over
        return not over

    def _scored_or_pending(self, child: Candidate) -> list[Candidate]:
        return [c for c in self.candidates.values() if c.status != "rejected" and c is not child]

    def _scored(self) -> list[Candidate]:
        return [c for c in self.candidates.values() if c.status != "rejected" and c.val_scores]

    def _next_prompt(self, parent: Candidate) -> str:
        names = sorted(parent.prompts)
        self.turn += 1
        return names[(self.turn - 1) % len(names)]

    def _train_batch(self, session: RolloutSession) -> list[Any]:
        size = min(self.settings.gradient_batch_size, len(session.train))
        indices = _cycle(len(session.train), self.train_position, size, self.settings.seed)
        self.train_position += len(indices)
        return [session.train[i] for i in indices]

    def _val_batch(self, session: RolloutSession) -> list[int]:
        size = min(self.settings.val_batch_size, len(session.val))
        indices = _cycle(len(session.val), self.val_position, size, self.settings.seed + 1)
        self.val_position += len(indices)
        return indices


def _all(tasks: Sequence[Any]) -> list[int]:
    return list(range(len(tasks)))


def _cycle(length: int, position: int, size: int, seed: int) -> list[int]:
    """``size`` indices from ``position`` on in an endless sequence of shuffled passes over
    ``range(length)`` (each pass shuffled by ``seed`` and its number): the same on every resume."""
    orders: dict[int, list[int]] = {}
    indices = []
    for at in range(position, position + size):
        number, offset = divmod(at, length)
        if number not in orders:
            orders[number] = list(range(length))
            random.Random(seed * 1_000_003 + number).shuffle(orders[number])
        indices.append(orders[number][offset])
    return indices
