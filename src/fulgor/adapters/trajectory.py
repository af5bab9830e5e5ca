"""Spans -> trajectories: the exact tokens a rollout's model calls sampled, ready for training.

Rules (docs/architecture.md, "Trajectories"):

* A rollout's model calls are taken in the order the store recorded them. Consecutive calls merge
  into one token row only when the next call's prompt ids start with the previous row's ids
  exactly (prompt + response); the tokens in between (tool results, user turns) join the row as
  context under loss mask 0. Anything else starts a new row and counts as a merge break: a chat
  template that is not append-only (one that drops earlier reasoning, say) cannot be trained as
  one sequence, and re-tokenising it would train on tokens the model never sampled. Calls of
  different agents never merge: the next agent's call starts a new row (not a merge break).
* Calls without engine token ids are never trained on; they are counted. So are calls without
  the engine's logprobs: the update weighs each token by its sampling logprob, and a made-up value
  would silently skew it. Failed calls (``ModelCall.error``) and calls that sampled no token are
  counted apart: nothing the engine sampled is lost with them.
* The rollout reward (the primary value of its last ``fulgor.reward`` span, or the ``reward``
  passed in) is the reward of every row. ``reward_mode="per_call"`` also fills each row's
  ``returns``: per token, the rewards emitted after its call started (until the next call
  started), plus later ones discounted by ``discount`` per later call. A rollout without reward
  spans (its reward passed in) gets that reward on its last call. The built-in GRPO update trains
  on the rollout reward; ``returns`` are there for algorithms that assign credit per call.
* ``agent_match`` (a regular expression, searched in each call's agent name: the ``X-Fulgor-Agent``
  header, else the agent its OpenTelemetry spans name, see :mod:`fulgor.adapters.agents`) keeps
  only the calls of the chosen agents of a multi-agent system; the others are counted as not
  matched (their text stays in a later call's prompt as context, under mask 0).

Every step reports what it did in a :class:`DriftReport`, and :func:`verify_rows` re-checks that
every trained token equals the id the engine returned for that position.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from fulgor import semconv
from fulgor.adapters.agents import with_agent_names
from fulgor.types import ModelCall, Rollout, Span

__all__ = [
    "DriftReport",
    "Trajectory",
    "TrajectoryRow",
    "build_trajectory",
    "call_left_out",
    "model_calls",
    "rollout_feedback",
    "rollout_reward",
    "rollout_reward_values",
    "verify_rows",
]


@dataclass
class TrajectoryRow:
    """One token sequence to train on: context (mask 0) and sampled tokens (mask 1)."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    sampled_logprobs: list[float] = field(default_factory=list)
    """The engine's logprob for each sampled token; 0.0 under mask 0."""
    calls: list[int] = field(default_factory=list)
    """Indices (into the rollout's trained calls) of the calls merged into this row."""
    returns: list[float] = field(default_factory=list)
    """Per token: the return of the call that sampled it (``per_call`` mode), else the reward."""
    agent_name: str | None = None
    """The agent whose calls the row holds: calls of different agents never share a row."""

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Trajectory:
    """A rollout's training rows and its reward."""

    rollout_id: str
    group_id: str | None
    reward: float
    rows: list[TrajectoryRow]
    model_versions: list[int | None]
    resources_id: str | None = None


@dataclass
class DriftReport:
    """What the adapter had to do with a batch of rollouts; zero everywhere is the healthy state."""

    calls_total: int = 0
    calls_trained: int = 0
    """Calls with at least one token in a returned row (not truncated or dropped away)."""
    calls_missing_ids: int = 0
    calls_missing_logprobs: int = 0
    calls_failed: int = 0
    """Calls recorded with an error (the upstream failed, or a stream was cut off): no sample."""
    calls_empty_response: int = 0
    """Calls whose response has no token: nothing was sampled, so nothing is lost."""
    calls_not_matched: int = 0
    merge_breaks: int = 0
    truncated_rows: int = 0
    dropped_rows: int = 0
    rollouts_without_calls: int = 0
    """Rollouts with no call left to train on."""
    rollouts_without_reward: int = 0
    """Rollouts with calls to train on but no reward (no reward span, none passed in)."""
    id_mismatches: int = 0
    spans_lost: int = 0
    """Spans of the rollout the store never got (each was logged where it was lost): a rollout with
    any is not trained on, as its trace is incomplete."""
    spans_unreadable: int = 0
    """Spans of the rollout that could not be read back: stored records that no longer read as spans
    (an older version stored them past today's limits), and model call or reward spans whose call
    or value is malformed. A rollout with any is not trained on, as its trace is incomplete."""

    LOSSES: ClassVar[tuple[str, ...]] = (
        "calls_missing_ids",
        "calls_missing_logprobs",
        "truncated_rows",
        "dropped_rows",
        "id_mismatches",
        "spans_lost",
        "spans_unreadable",
    )
    """Counters of calls or tokens not trained as the engine sampled them: 0 in a healthy run. (A
    merge break is not one: it trains the sampled ids exactly, in a new row.)"""

    def add(self, other: DriftReport) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_metrics(self, prefix: str = "drift/") -> dict[str, float]:
        return {f"{prefix}{name}": float(value) for name, value in vars(self).items()}


def model_calls(spans: Sequence[Span]) -> list[tuple[Span, ModelCall]]:
    """The rollout's model calls in store order (one span may hold one call per sampled choice),
    each with its agent's name: the one its request named, else the one its ancestor spans give
    (:mod:`fulgor.adapters.agents`)."""
    calls = []
    for span in sorted(spans, key=lambda s: s.sequence_id or 0):
        if span.name == semconv.SPAN_MODEL_CALL and semconv.ATTR_MODEL_CALL in span.attributes:
            calls.append((span, ModelCall.model_validate(span.attributes[semconv.ATTR_MODEL_CALL])))
    return with_agent_names(calls, spans)


def _reward_spans(spans: Sequence[Span]) -> list[Span]:
    return sorted(
        (s for s in spans if s.name == semconv.SPAN_REWARD and semconv.ATTR_REWARD_VALUE in s.attributes),
        key=lambda s: s.sequence_id or 0,
    )


def rollout_reward(spans: Sequence[Span]) -> float | None:
    """The primary value of the rollout's last reward span (None when it emitted none)."""
    rewards = _reward_spans(spans)
    return float(rewards[-1].attributes[semconv.ATTR_REWARD_VALUE]) if rewards else None


def rollout_reward_values(spans: Sequence[Span]) -> dict[str, float]:
    """The named values of the rollout's last reward span other than its primary one (empty when it
    emitted none, or a single value)."""
    rewards = _reward_spans(spans)
    if not rewards:
        return {}
    values = rewards[-1].attributes.get(semconv.ATTR_REWARD_VALUES)
    primary = rewards[-1].attributes.get(semconv.ATTR_REWARD_PRIMARY)
    if not isinstance(values, dict):
        return {}
    return {
        str(name): float(value)
        for name, value in values.items()
        if name != primary
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def rollout_feedback(spans: Sequence[Span]) -> str | None:
    """The feedback text of the rollout's last reward span (None when it gave none)."""
    rewards = _reward_spans(spans)
    feedback = rewards[-1].attributes.get(semconv.ATTR_REWARD_FEEDBACK) if rewards else None
    return feedback if isinstance(feedback, str) else None


def build_trajectory(
    rollout: Rollout,
    spans: Sequence[Span],
    *,
    reward: float | None = None,
    agent_match: str | None = None,
    reward_mode: Literal["final", "per_call"] = "final",
    discount: float = 1.0,
    max_tokens: int | None = None,
) -> tuple[Trajectory | None, DriftReport]:
    """Turn one rollout's spans into training rows; None when nothing in it can be trained on.

    ``reward`` overrides the rollout's reward spans as the rollout reward. In ``per_call`` mode the
    returns still come from the reward spans; a rollout without any gets ``reward`` on its last
    call (as if emitted once the agent was done).
    """
    report = DriftReport()
    final_reward = reward if reward is not None else rollout_reward(spans)
    calls = _trainable_calls(model_calls(spans), agent_match, report)
    if not calls:
        report.rollouts_without_calls += 1
        return None, report
    if final_reward is None:
        report.rollouts_without_reward += 1
        return None, report
    returns = _call_returns(calls, spans, final_reward, reward_mode, discount)
    rows = _merge(calls, returns, report)
    rows = _fit(rows, max_tokens, report)
    report.id_mismatches += verify_rows(rows, [call for _, call in calls])
    if not rows:
        report.rollouts_without_calls += 1
        return None, report
    report.calls_trained += _calls_in(rows, [call for _, call in calls])
    trajectory = Trajectory(
        rollout_id=rollout.rollout_id,
        group_id=rollout.group_id,
        reward=final_reward,
        rows=rows,
        model_versions=[call.model_version for _, call in calls],
        resources_id=rollout.resources_id,
    )
    return trajectory, report


def _trainable_calls(
    calls: list[tuple[Span, ModelCall]], agent_match: str | None, report: DriftReport
) -> list[tuple[Span, ModelCall]]:
    pattern = re.compile(agent_match) if agent_match is not None else None
    kept = []
    for span, call in calls:
        report.calls_total += 1
        left_out = call_left_out(call, pattern)
        if left_out is None:
            kept.append((span, call))
        else:
            setattr(report, left_out, getattr(report, left_out) + 1)
    return kept


def call_left_out(call: ModelCall, agent_match: re.Pattern[str] | None) -> str | None:
    """Why a call is not trained on, as the :class:`DriftReport` counter that counts it
    (``calls_not_matched``, ``calls_failed``, ...), or None when it can be."""
    agent = call.agent_name
    if agent_match is not None and (agent is None or not agent_match.search(str(agent))):
        return "calls_not_matched"
    if call.error is not None:
        return "calls_failed"
    if call.token_ids_missing or call.prompt_token_ids is None or call.response_token_ids is None:
        return "calls_missing_ids"
    if not call.response_token_ids:
        # Skipping it keeps merges exact: the next call's prompt still extends the row.
        return "calls_empty_response"
    if call.response_logprobs is None:  # when present, ModelCall has one per response id
        return "calls_missing_logprobs"
    return None


def _calls_in(rows: list[TrajectoryRow], calls: list[ModelCall]) -> int:
    """How many calls have a token in ``rows``: a row starts with each of its calls' prompt (see
    :func:`verify_rows`), so a call's response begins at its prompt's length."""
    return sum(
        len(calls[index].prompt_token_ids or []) < len(row.token_ids) for row in rows for index in row.calls
    )


def _call_returns(
    calls: list[tuple[Span, ModelCall]],
    spans: Sequence[Span],
    final_reward: float,
    reward_mode: str,
    discount: float,
) -> list[float]:
    if reward_mode == "final":
        return [final_reward] * len(calls)
    # A reward belongs to the call that started last before it was emitted; the first call also
    # takes any emitted before it. By time, not store order: the gateway writes model call spans
    # in batches, so a reward can reach the store before the call it follows. Start times, not
    # end times: a call's duration leaves room for the clocks of the gateway (the call's times)
    # and the runner (the reward's) to differ a little.
    starts = [span.start_time for span, _ in calls]
    immediate = [0.0] * len(calls)
    reward_spans = _reward_spans(spans)
    if not reward_spans:  # the reward was passed in: it comes once the agent is done
        immediate[-1] = final_reward
    for reward_span in reward_spans:
        before = [i for i, start in enumerate(starts) if start <= reward_span.start_time]
        # Ties (the choices of one request share its start time) go to the later call in store order.
        index = max(before, key=lambda i: (starts[i], i)) if before else 0
        immediate[index] += float(reward_span.attributes[semconv.ATTR_REWARD_VALUE])
    returns = [0.0] * len(calls)
    running = 0.0
    for index in range(len(calls) - 1, -1, -1):
        running = immediate[index] + discount * running
        returns[index] = running
    return returns


def _merge(
    calls: list[tuple[Span, ModelCall]], returns: list[float], report: DriftReport
) -> list[TrajectoryRow]:
    rows: list[TrajectoryRow] = []
    row: TrajectoryRow | None = None
    for index, (_, call) in enumerate(calls):
        prompt = call.prompt_token_ids or []
        response = call.response_token_ids or []
        logprobs = call.response_logprobs or []  # one per response id (see _trainable_calls)
        same_agent = row is not None and row.agent_name == call.agent_name
        if row is not None and same_agent and prompt[: len(row.token_ids)] == row.token_ids:
            context = prompt[len(row.token_ids) :]
        else:
            if row is not None and same_agent:
                report.merge_breaks += 1
            row = TrajectoryRow(agent_name=call.agent_name)
            rows.append(row)
            context = prompt
        row.token_ids += context + response
        row.loss_mask += [0] * len(context) + [1] * len(response)
        row.sampled_logprobs += [0.0] * len(context) + list(logprobs)
        row.returns += [returns[index]] * (len(context) + len(response))
        row.calls.append(index)
    return rows


def _fit(rows: list[TrajectoryRow], max_tokens: int | None, report: DriftReport) -> list[TrajectoryRow]:
    kept = []
    for row in rows:
        if max_tokens is not None and len(row.token_ids) > max_tokens:
            report.truncated_rows += 1
            row.token_ids = row.token_ids[:max_tokens]
            row.loss_mask = row.loss_mask[:max_tokens]
            row.sampled_logprobs = row.sampled_logprobs[:max_tokens]
            row.returns = row.returns[:max_tokens]
        if row.trained_tokens == 0:
            report.dropped_rows += 1
        else:
            kept.append(row)
    return kept


def verify_rows(rows: Sequence[TrajectoryRow], calls: Sequence[ModelCall]) -> int:
    """Count positions where a row disagrees with what the engine saw and returned.

    For every call a row claims to hold, the row must start with the call's prompt ids, and the
    call's response ids must follow them under mask 1. Returns 0 when the rows are exactly the
    engine's tokens (truncated rows are checked up to their end).
    """
    mismatches = 0
    for row in rows:
        length = len(row.token_ids)
        for index in row.calls:
            prompt = calls[index].prompt_token_ids or []
            response = calls[index].response_token_ids or []
            seen = min(len(prompt), length)
            mismatches += sum(1 for a, e in zip(row.token_ids[:seen], prompt[:seen], strict=True) if a != e)
            end = min(len(prompt) + len(response), length)
            for position in range(len(prompt), end):
                expected = response[position - len(prompt)]
                if row.token_ids[position] != expected or row.loss_mask[position] != 1:
                    mismatches += 1
    return mismatches
