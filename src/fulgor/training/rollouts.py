"""Rollouts for training and evaluation: enqueue them, wait for them, read what they produced.

``run_rollouts`` enqueues requests and waits until every rollout has ended (the store's watchdog
ends rollouts whose agents hang or whose runners die, by their ``RolloutConfig``); when the wait
is cancelled or fails, it cancels the rollouts it enqueued that have not ended, so that no runner
claims them later.
``read_outcome`` turns one ended rollout's spans into a :class:`RolloutOutcome`: its reward, model
calls, trajectory and drift report. Only succeeded rollouts become trajectories.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from fulgor.adapters.trajectory import (
    DriftReport,
    Trajectory,
    build_trajectory,
    model_calls,
    rollout_reward,
    rollout_reward_values,
)
from fulgor.errors import InvalidTransitionError
from fulgor.semconv import (
    ATTEMPT_SPANS_LOST,
    ATTR_MODEL_CALL,
    ATTR_REWARD_VALUE,
    SPAN_MODEL_CALL,
    SPAN_REWARD,
)
from fulgor.store.base import LATEST, Store
from fulgor.training.runners import RunnerGroup
from fulgor.types import ModelCall, Rollout, RolloutRequest, Span

__all__ = [
    "RolloutOutcome",
    "groups_without_signal",
    "read_outcome",
    "requested_tools",
    "run_rollouts",
    "validation_metrics",
]

logger = logging.getLogger(__name__)

_WAIT_SLICE_SECONDS = 5.0


@dataclass
class RolloutOutcome:
    """One ended rollout as training and debugging see it (``tool_calls``: how many tools its
    model calls asked for)."""

    rollout: Rollout
    reward: float | None
    model_calls: int
    trajectory: Trajectory | None
    drift: DriftReport = field(default_factory=DriftReport)
    error: str | None = None
    tool_calls: int = 0
    agent_names: tuple[str | None, ...] = ()
    """The agent of each of its model calls (None for a call no header or span names)."""
    reward_values: dict[str, float] = field(default_factory=dict)
    """The named values of its reward other than the primary one (empty for a single value)."""

    @property
    def sampled_tokens(self) -> int:
        if self.trajectory is None:
            return 0
        return sum(row.trained_tokens for row in self.trajectory.rows)


async def run_rollouts(
    store: Store, requests: Sequence[RolloutRequest], runners: RunnerGroup
) -> list[Rollout]:
    """Enqueue ``requests`` and return their rollouts, in order, once every one has ended.

    Cancelled or failing (the time budget ran out, Ctrl+C, the runners died), it cancels those not
    ended yet before it raises: left queued, they would be claimed by the next runners to come.
    """
    if not requests:
        return []
    enqueued = await store.enqueue(requests)
    ended: dict[str, Rollout] = {}
    pending = [rollout.rollout_id for rollout in enqueued]
    try:
        while pending:
            runners.check()
            for rollout in await store.wait(pending, timeout_seconds=_WAIT_SLICE_SECONDS):
                ended[rollout.rollout_id] = rollout
            pending = [rollout_id for rollout_id in pending if rollout_id not in ended]
    except BaseException:
        # Shielded: a second cancellation (another Ctrl+C) must not stop the cancelling halfway.
        await asyncio.shield(_cancel_unfinished(store, pending))
        raise
    return [ended[rollout.rollout_id] for rollout in enqueued]


async def _cancel_unfinished(store: Store, rollout_ids: list[str]) -> None:
    """Cancel those of ``rollout_ids`` that have not ended; a failure is logged, not raised (the
    error that got here is the one to report)."""
    try:
        while rollout_ids:
            try:
                await store.cancel(rollout_ids)
                logger.info("cancelled %d rollouts that had not ended", len(rollout_ids))
                return
            except InvalidTransitionError:  # one ended meanwhile, and then the store cancels none
                ended = {rollout.rollout_id for rollout in await store.wait(rollout_ids, timeout_seconds=0)}
                if not ended:
                    raise
                rollout_ids = [rollout_id for rollout_id in rollout_ids if rollout_id not in ended]
    except Exception:
        logger.exception(
            "could not cancel %d unfinished rollouts; runners may still claim them", len(rollout_ids)
        )


async def read_outcome(
    store: Store,
    rollout: Rollout,
    *,
    agent_match: str | None = None,
    max_tokens: int | None = None,
    spans_lost: int = 0,
) -> RolloutOutcome:
    """The reward, model calls, trajectory and drift of one ended rollout's latest attempt.

    ``spans_lost`` counts spans of the rollout lost on the way to the store outside its attempt's
    own record (the gateway's); with those its attempt records, a rollout that lost any is not
    trained on: its trace is incomplete. Nor is one with spans that do not read back (stored
    records the store skips, model call or reward spans that are malformed): they are counted in
    ``spans_unreadable``, and training goes on with the other rollouts.
    """
    stored = await store.query_spans(rollout.rollout_id, LATEST)
    spans, malformed = _readable(stored)
    unreadable = malformed + getattr(stored, "spans_unreadable", 0)
    attempts = await store.list_attempts(rollout.rollout_id)
    latest = attempts[-1] if attempts else None
    lost = spans_lost + (_lost_in(latest.metadata) if latest is not None else 0)
    calls = model_calls(spans)
    agents = tuple(call.agent_name for _, call in calls)
    reward = rollout_reward(spans)
    values = rollout_reward_values(spans)
    tool_calls = sum(len(requested_tools(call)) for _, call in calls)
    if rollout.status != "succeeded":
        error = (latest.error if latest is not None else None) or rollout.status
    elif lost:
        error = f"{lost} of its spans were not stored (the runner's and the gateway's logs say which)"
    elif unreadable:
        error = f"{unreadable} of its spans could not be read back (the store's log says which rollout)"
    else:
        trajectory, drift = build_trajectory(rollout, spans, agent_match=agent_match, max_tokens=max_tokens)
        return RolloutOutcome(
            rollout,
            reward,
            len(calls),
            trajectory,
            drift,
            tool_calls=tool_calls,
            agent_names=agents,
            reward_values=values,
        )
    drift = DriftReport(spans_lost=lost, spans_unreadable=unreadable)
    return RolloutOutcome(
        rollout,
        reward,
        len(calls),
        None,
        drift,
        error=error,
        tool_calls=tool_calls,
        agent_names=agents,
        reward_values=values,
    )


def _readable(spans: Sequence[Span]) -> tuple[list[Span], int]:
    """The spans training can read, and how many it cannot: a ``fulgor.model_call`` span whose call
    is not a ModelCall, a ``fulgor.reward`` span whose value is not a finite number (any agent or
    OpenTelemetry exporter may send spans of those names). Such a span would stop training."""
    readable: list[Span] = []
    for span in spans:
        if span.name == SPAN_MODEL_CALL and ATTR_MODEL_CALL in span.attributes:
            try:
                ModelCall.model_validate(span.attributes[ATTR_MODEL_CALL])
            except pydantic.ValidationError:
                continue
        elif span.name == SPAN_REWARD and ATTR_REWARD_VALUE in span.attributes:
            value = span.attributes[ATTR_REWARD_VALUE]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                continue
        readable.append(span)
    return readable, len(spans) - len(readable)


def _lost_in(metadata: dict[str, Any]) -> int:
    value = metadata.get(ATTEMPT_SPANS_LOST, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def requested_tools(call: ModelCall) -> list[Any]:
    """The tool calls a chat completion's message asked for (none for text completions)."""
    message = call.response.get("message")
    requested = message.get("tool_calls") if isinstance(message, dict) else None
    return requested if isinstance(requested, list) else []


def agent_match_problem(agent_match: str | None, outcomes: Sequence[RolloutOutcome]) -> str | None:
    """Why ``agent_match`` can train nothing: the rollouts made model calls, but none of an agent
    whose name it matches (the names seen are listed); None when it matched one, or nothing ran."""
    if agent_match is None:
        return None
    seen = Counter(name for outcome in outcomes for name in outcome.agent_names)
    pattern = re.compile(agent_match)
    if not seen or any(name is not None and pattern.search(name) for name in seen):
        return None
    names = ", ".join(
        f"{name!r} ({count} call{'s' * (count != 1)})" for name, count in sorted(seen.items(), key=_by_name)
    )
    return (
        f"agent_match {agent_match!r} matches none of the agents these rollouts' model calls came from: "
        f"{names}. None is a call whose request had no X-Fulgor-Agent header and whose OpenTelemetry "
        "spans name no agent; match one of the names seen (a regular expression searched in the name)"
    )


def _by_name(item: tuple[str | None, int]) -> tuple[bool, str]:
    return item[0] is None, item[0] or ""


def validation_metrics(outcomes: Sequence[RolloutOutcome]) -> dict[str, float]:
    """A validation's metrics over its rollouts (see :meth:`fulgor.Trainer.validate`).

    >>> from fulgor.types import Rollout
    >>> def outcome(reward, tools, values):
    ...     rollout = Rollout(rollout_id="r", input={}, status="succeeded", enqueue_time=0.0)
    ...     return RolloutOutcome(rollout, reward, 1, None, tool_calls=tools, reward_values=values)
    >>> metrics = validation_metrics([outcome(1.0, 2, {"f1": 1.0}), outcome(0.1, 0, {"f1": 0.0})])
    >>> metrics["val_accuracy"], metrics["val_tool_call_rate"], metrics["val_tool_calls"], metrics["val_f1"]
    (0.55, 0.5, 1.0, 0.5)
    """
    count = max(len(outcomes), 1)
    metrics: dict[str, float] = {
        "val_accuracy": sum(o.reward or 0.0 for o in outcomes) / count,
        "val_tool_call_rate": sum(1 for o in outcomes if o.tool_calls) / count,
        "val_tool_calls": sum(o.tool_calls for o in outcomes) / count,
        "val_rollouts_failed": sum(1 for o in outcomes if o.rollout.status != "succeeded"),
    }
    named: dict[str, list[float]] = {}
    for outcome in outcomes:
        for name, value in outcome.reward_values.items():
            named.setdefault(name, []).append(value)
    metrics.update({f"val_{name}": sum(values) / len(values) for name, values in sorted(named.items())})
    return metrics


def groups_without_signal(outcomes: Sequence[RolloutOutcome]) -> int:
    """Groups with no advantage to learn: fewer than two of their rollouts produced a trajectory
    (failed rollouts produce none), or all those that did got the same reward."""
    rewards: dict[str, list[float]] = {}
    for outcome in outcomes:
        group = rewards.setdefault(outcome.rollout.group_id or outcome.rollout.rollout_id, [])
        if outcome.trajectory is not None:
            group.append(outcome.trajectory.reward)
    return sum(1 for values in rewards.values() if len(values) < 2 or max(values) == min(values))
