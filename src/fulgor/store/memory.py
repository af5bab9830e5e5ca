"""MemoryStore: the whole store in one process's memory, for tests and single-process runs.

It keeps the contract of :mod:`fulgor.store.base` exactly, but nothing survives the process; use
:class:`fulgor.store.sqlite.SqliteStore` for anything that must outlive it. A MemoryStore belongs
to one thread at a time (its coroutines do not await while they change state, so any number of
tasks on one event loop may share it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

from fulgor.errors import NotFoundError, ValidationError
from fulgor.limits import quoted
from fulgor.store import _rules as rules
from fulgor.store.base import LATEST
from fulgor.store.validated import ValidatedStore
from fulgor.types import (
    ROLLOUT_QUEUED_STATUSES,
    ROLLOUT_TERMINAL_STATUSES,
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    JsonDict,
    Resources,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutRequest,
    Span,
    StoreStats,
    Worker,
)

__all__ = ["MemoryStore"]


class MemoryStore(ValidatedStore):
    """In-process store; see :class:`fulgor.store.base.Store` for the contract."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._rollouts: dict[str, Rollout] = {}
        self._queue: dict[str, None] = {}  # an ordered set: FIFO with O(1) removal
        self._attempts: dict[str, list[Attempt]] = {}
        self._live: dict[str, Attempt] = {}  # rollout_id -> its live attempt
        self._spans: dict[str, list[Span]] = {}  # attempt_id -> spans in sequence order
        self._span_ids: dict[tuple[str, str], Span] = {}  # (attempt_id, span_id) -> span
        self._span_total = 0
        self._resources: dict[str, ResourcesVersion] = {}
        self._latest_resources: ResourcesVersion | None = None
        self._workers: dict[str, Worker] = {}
        self._signal = rules.ChangeSignal()
        self._closed = False

    # -- rollouts ---------------------------------------------------------------------------------

    async def _enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        self._sweep()
        now = self._clock()
        created = [rules.rollout_from_request(request, now) for request in requests]
        for rollout in created:
            self._rollouts[rollout.rollout_id] = rollout
            self._attempts[rollout.rollout_id] = []
            self._queue[rollout.rollout_id] = None
        if created:
            self._signal.notify()
        return created

    async def _start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout:
        self._sweep()
        rollout = rules.rollout_from_request(request, self._clock())
        self._rollouts[rollout.rollout_id] = rollout
        self._attempts[rollout.rollout_id] = []
        return self._begin(rollout, worker_id)

    async def _claim(self, worker_id: str, limit: int, wait_seconds: float) -> list[AttemptedRollout]:
        async def claim_once() -> list[AttemptedRollout] | None:
            return self._claim_now(worker_id, limit) or None

        claimed = await rules.wait_for_result(
            claim_once, self._signal, wait_seconds, self._seconds_to_deadline
        )
        return claimed or []

    async def _get_rollout(self, rollout_id: str) -> Rollout:
        self._sweep()
        return self._rollout(rollout_id)

    async def _query_rollouts(
        self,
        statuses: frozenset[str] | None,
        group_id: str | None,
        mode: RolloutMode | None,
        limit: int | None,
        offset: int,
        order: Literal["asc", "desc"],
    ) -> list[Rollout]:
        self._sweep()
        rollouts = list(self._rollouts.values())
        if order == "desc":
            rollouts.reverse()
        matching = [
            rollout
            for rollout in rollouts
            if (statuses is None or rollout.status in statuses)
            and (group_id is None or rollout.group_id == group_id)
            and (mode is None or rollout.mode == mode)
        ]
        end = None if limit is None else offset + limit
        return matching[offset:end]

    async def _cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        self._sweep()
        rollouts = [self._rollout(rollout_id) for rollout_id in rollout_ids]
        rules.check_cancellable(rollouts)
        now = self._clock()
        result = []
        for rollout in rollouts:
            if rollout.status != "cancelled":
                rollout = self._cancel_one(rollout, now)
            result.append(rollout)
        self._signal.notify()
        return result

    async def _start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout:
        self._sweep()
        return self._begin(self._rollout(rollout_id), worker_id)

    # -- attempts ---------------------------------------------------------------------------------

    async def _update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | None,
        error: str | None,
        metadata: JsonDict | None,
    ) -> Attempt:
        self._sweep()
        attempt = self._attempt(rollout_id, attempt_id)
        now = self._clock()
        updated = rules.updated_attempt(attempt, now, status=status, error=error, metadata=metadata)
        self._put_attempt(updated, now)
        return updated

    async def _list_attempts(self, rollout_id: str) -> list[Attempt]:
        self._sweep()
        self._rollout(rollout_id)
        return list(self._attempts[rollout_id])

    # -- spans ------------------------------------------------------------------------------------

    async def _add_spans(self, spans: Sequence[Span]) -> list[Span]:
        self._sweep()
        for span in spans:
            self._attempt(span.rollout_id, span.attempt_id)
        now = self._clock()
        stored = [self._add_span(span) for span in spans]
        touched = {(span.rollout_id, span.attempt_id) for span in spans}
        for rollout_id, attempt_id in touched:
            self._touch(self._attempt(rollout_id, attempt_id), now, running=True)
        return stored

    async def _query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None,
        name: str | None,
        limit: int | None,
        offset: int,
    ) -> list[Span]:
        self._sweep()
        self._rollout(rollout_id)
        attempts = self._attempts[rollout_id]
        if attempt_id == LATEST:
            attempts = attempts[-1:]
        elif attempt_id is not None:
            attempts = [self._attempt(rollout_id, attempt_id)]
        spans = [
            span
            for attempt in attempts
            for span in self._spans.get(attempt.attempt_id, ())
            if name is None or span.name == name
        ]
        end = None if limit is None else offset + limit
        return spans[offset:end]

    # -- resources --------------------------------------------------------------------------------

    async def _put_resources(self, resources: Resources, resources_id: str | None) -> ResourcesVersion:
        self._check_open()
        version = 1 if self._latest_resources is None else self._latest_resources.version + 1
        stored = rules.resources_version(resources, resources_id, version, self._clock())
        self._resources[stored.resources_id] = stored
        self._latest_resources = stored
        return stored

    async def _get_resources(self, resources_id: str | None) -> ResourcesVersion | None:
        self._check_open()
        if resources_id is None:
            return self._latest_resources
        if resources_id not in self._resources:
            raise NotFoundError(f"resources {quoted(resources_id)} not found")
        return self._resources[resources_id]

    # -- workers, waiting, stats -------------------------------------------------------------------

    async def _heartbeat(
        self, worker_id: str, stats: JsonDict | None, attempt_ids: Sequence[str] | None
    ) -> Worker:
        self._sweep()
        now = self._clock()
        worker = self._see_worker(worker_id, now, stats)
        only = None if attempt_ids is None else frozenset(attempt_ids)
        for attempt in list(self._live.values()):
            if attempt.worker_id == worker_id and (only is None or attempt.attempt_id in only):
                self._touch(attempt, now, running=False)
        return worker

    async def _list_workers(self) -> list[Worker]:
        self._check_open()
        return list(self._workers.values())

    async def _wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        self._check_open()
        for rollout_id in rollout_ids:
            self._rollout(rollout_id)

        async def all_done() -> list[Rollout] | None:
            self._sweep()
            done = [
                self._rollouts[r]
                for r in rollout_ids
                if self._rollouts[r].status in ROLLOUT_TERMINAL_STATUSES
            ]
            return done if len(done) == len(rollout_ids) else None

        done = await rules.wait_for_result(all_done, self._signal, timeout_seconds, self._seconds_to_deadline)
        if done is not None:
            return done
        return [
            self._rollouts[r] for r in rollout_ids if self._rollouts[r].status in ROLLOUT_TERMINAL_STATUSES
        ]

    async def _stats(self) -> StoreStats:
        self._sweep()
        rollouts: dict[str, int] = {}
        for rollout in self._rollouts.values():
            rollouts[rollout.status] = rollouts.get(rollout.status, 0) + 1
        attempts: dict[str, int] = {}
        for attempt_list in self._attempts.values():
            for attempt in attempt_list:
                attempts[attempt.status] = attempts.get(attempt.status, 0) + 1
        return StoreStats(
            rollouts=rollouts,
            attempts=attempts,
            spans=self._span_total,
            workers=len(self._workers),
            resources_versions=len(self._resources),
        )

    async def close(self) -> None:
        self._closed = True
        self._signal.notify()

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValidationError("the store is closed; create a new one")

    def _rollout(self, rollout_id: str) -> Rollout:
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFoundError(f"rollout {quoted(rollout_id)} not found") from None

    def _attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        self._rollout(rollout_id)
        for attempt in reversed(self._attempts[rollout_id]):
            if attempt.attempt_id == attempt_id:
                return attempt
        raise NotFoundError(f"attempt {quoted(attempt_id)} of rollout {quoted(rollout_id)} not found")

    def _claim_now(self, worker_id: str, limit: int) -> list[AttemptedRollout]:
        self._check_open()
        self._sweep()
        claimed: list[AttemptedRollout] = []
        while self._queue and len(claimed) < limit:
            rollout_id = next(iter(self._queue))
            claimed.append(self._begin(self._rollouts[rollout_id], worker_id))
        if claimed:
            self._see_worker(worker_id, self._clock(), None)
        return claimed

    def _begin(self, rollout: Rollout, worker_id: str) -> AttemptedRollout:
        now = self._clock()
        latest = self._latest_resources.resources_id if self._latest_resources else None
        rollout, attempt = rules.begin_attempt(rollout, worker_id, now, latest)
        self._queue.pop(rollout.rollout_id, None)
        self._rollouts[rollout.rollout_id] = rollout
        self._attempts[rollout.rollout_id].append(attempt)
        self._live[rollout.rollout_id] = attempt
        if rules.watchdog_deadline(attempt, rollout.config) is not None:
            self._signal.notify()  # waiting calls sleep until the next deadline: this one may be sooner
        return rules.attempted(rollout, attempt)

    def _put_attempt(self, attempt: Attempt, now: float) -> None:
        """Store a changed attempt and move its rollout along the state machine."""
        attempts = self._attempts[attempt.rollout_id]
        index = next(
            i for i in range(len(attempts) - 1, -1, -1) if attempts[i].attempt_id == attempt.attempt_id
        )
        attempts[index] = attempt
        if index != len(attempts) - 1:
            return
        rollout = self._rollouts[attempt.rollout_id]
        if rollout.status in ROLLOUT_TERMINAL_STATUSES:
            return
        if attempt.is_live:
            self._live[attempt.rollout_id] = attempt
        else:
            self._live.pop(attempt.rollout_id, None)
        updated = rules.rollout_after_attempt(rollout, attempt, now)
        self._rollouts[rollout.rollout_id] = updated
        if updated.status != rollout.status:
            if updated.status in ROLLOUT_QUEUED_STATUSES:
                self._queue[updated.rollout_id] = None
            self._signal.notify()

    def _touch(self, attempt: Attempt, now: float, *, running: bool) -> None:
        """Record activity on a live attempt; a span (``running``) also marks it started."""
        if not attempt.is_live:
            return
        status = "running" if running else attempt.status
        self._put_attempt(attempt.model_copy(update={"status": status, "last_active_time": now}), now)

    def _add_span(self, span: Span) -> Span:
        key = (span.attempt_id, span.span_id)
        existing = self._span_ids.get(key)
        if existing is not None:
            return existing
        spans = self._spans.setdefault(span.attempt_id, [])
        stored = span.model_copy(update={"sequence_id": len(spans) + 1})
        spans.append(stored)
        self._span_ids[key] = stored
        self._span_total += 1
        return stored

    def _cancel_one(self, rollout: Rollout, now: float) -> Rollout:
        attempt = self._live.pop(rollout.rollout_id, None)
        if attempt is not None:
            ended = rules.move_attempt(attempt, "failed", now, "cancelled")
            attempts = self._attempts[rollout.rollout_id]
            attempts[-1] = ended
        self._queue.pop(rollout.rollout_id, None)
        cancelled = rollout.model_copy(update={"status": "cancelled", "end_time": now})
        self._rollouts[rollout.rollout_id] = cancelled
        return cancelled

    def _see_worker(self, worker_id: str, now: float, stats: JsonDict | None) -> Worker:
        known = self._workers.get(worker_id)
        if known is None:
            worker = Worker(
                worker_id=worker_id, first_seen_time=now, last_heartbeat_time=now, stats=stats or {}
            )
        else:
            update: JsonDict = {"last_heartbeat_time": now}
            if stats is not None:
                update["stats"] = stats
            worker = known.model_copy(update=update)
        self._workers[worker_id] = worker
        return worker

    def _sweep(self) -> None:
        """Apply the watchdog: end live attempts past their timeout or silence deadline.

        Operations call it before they read or write, so it also refuses them once the store is closed.
        """
        self._check_open()
        if not self._live:
            return
        now = self._clock()
        for attempt in list(self._live.values()):
            verdict = rules.overdue(attempt, self._rollouts[attempt.rollout_id].config, now)
            if verdict is not None:
                status, when = verdict
                self._put_attempt(
                    rules.move_attempt(attempt, status, when, rules.WATCHDOG_ERRORS[status]), when
                )

    def _seconds_to_deadline(self) -> float | None:
        deadlines = [
            deadline
            for attempt in self._live.values()
            if (deadline := rules.watchdog_deadline(attempt, self._rollouts[attempt.rollout_id].config))
            is not None
        ]
        return min(deadlines) - self._clock() if deadlines else None
