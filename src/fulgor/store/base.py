"""The Store protocol: the contract every backend (memory, SQLite, HTTP client, PostgreSQL) keeps.

The store owns rollouts, their attempts, spans and versioned resources. It knows nothing of
agents, gateways or training; it only keeps state correct under concurrency and restarts.

Rollout state machine::

    queuing ──claim/start_attempt──► preparing ──first span or update──► running
       ▲                                │                                   │
       │                                └──────────── attempt ends ─────────┤
       │                                                                    ▼
    requeuing ◄── attempt failed/timeout/unresponsive, its outcome in retry_on and
                  attempts left (attempt_count < max_attempts)
                                                        otherwise ──► failed
                  attempt succeeded ──► succeeded;  cancel() from any non-terminal ──► cancelled

``succeeded``, ``failed`` and ``cancelled`` are final. ``requeuing`` rollouts wait in the queue
again, behind everything enqueued before they were requeued.

Attempt state machine::

    preparing ──► running ──► succeeded | failed | timeout | unresponsive
        └───────────────────► succeeded | failed | timeout | unresponsive

The four end statuses are final. A rollout has at most one live (preparing or running)
attempt at any time; only its latest attempt can be live.

Watchdog: an attempt whose rollout sets ``config.timeout_seconds`` is marked ``timeout`` once it
has run that long since it started; one whose rollout sets ``config.unresponsive_seconds`` is
marked ``unresponsive`` after that long without activity (a span, an ``update_attempt`` or a
heartbeat of its worker). Either outcome requeues or fails the rollout as above. The store
applies the watchdog before every operation and wakes waiting ``claim``/``wait`` calls at the
next deadline, so no background thread is needed and every read sees deadlines already applied
(a backend may batch this check over a few milliseconds of its clock, never more).

Semantics every backend keeps:

* ``claim`` is FIFO over queued rollouts and gives each to exactly one caller, also across
  processes sharing one backend. ``claim(wait_seconds=...)`` and ``wait`` sleep on events
  (a notification when the queue or a status changes), not on polling loops.
* A missing id (the empty string too) raises :class:`~fulgor.errors.NotFoundError`; an
  impossible status change raises :class:`~fulgor.errors.InvalidTransitionError` naming both
  statuses; an invalid payload raises :class:`~fulgor.errors.ValidationError` naming the field
  (ids and names containing NUL characters, non-finite times and durations are invalid). A call
  that raises writes nothing. A database that cannot be reached raises
  :class:`~fulgor.errors.StoreUnavailableError` (worth retrying; one raised while committing
  cannot tell whether the commit happened).
* Span sequence ids are allocated by the store, strictly increasing within an attempt and
  starting at 1. Re-adding a span whose ``span_id`` the attempt already holds returns the stored
  span and writes nothing, so retried adds never duplicate.
* What is stored reads back: every write holds records to the limits of :mod:`fulgor.limits`
  (JSON nesting, a span's size, id and name lengths) and refuses one past them with
  ValidationError naming the limit. ``query_spans`` returns a :class:`SpanList`: a span record
  that does not read back (one an older version stored past those limits) is skipped and counted
  in its ``spans_unreadable``, so one bad record never hides the others.
* ``put_resources`` gives every put a version one above the highest so far; the highest is
  "latest". A rollout records the resources id it ran with when its first attempt starts.
* Returned objects are frozen pydantic models and may be shared with the store's own state:
  do not mutate their nested dicts; build changed copies with ``model_copy(update=...)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, Protocol, runtime_checkable

from fulgor.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    JsonDict,
    Resources,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    Worker,
)

__all__ = ["LATEST", "SpanList", "Store"]

LATEST: Literal["latest"] = "latest"


class SpanList(list[Span]):
    """The spans ``query_spans`` returns, and how many stored span records it skipped because they
    did not read back (``spans_unreadable``): a rollout with any is missing part of its trace."""

    def __init__(self, spans: Iterable[Span] = (), spans_unreadable: int = 0) -> None:
        super().__init__(spans)
        self.spans_unreadable = spans_unreadable


@runtime_checkable
class Store(Protocol):
    """Rollouts, attempts, spans, resources and workers; every method is a coroutine."""

    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Create one ``queuing`` rollout per request, in order, at the back of the queue."""
        ...

    async def start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout:
        """Create a rollout and its first attempt at once, skipping the queue (for ``dev`` runs)."""
        ...

    async def claim(self, worker_id: str, limit: int = 1, wait_seconds: float = 0) -> list[AttemptedRollout]:
        """Take up to ``limit`` queued rollouts, oldest first, each with a new ``preparing`` attempt.

        Returns at once when something is queued; otherwise sleeps until something is enqueued or
        requeued, or ``wait_seconds`` pass (then returns an empty list).
        """
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """The rollout; NotFoundError when the id is unknown."""
        ...

    async def query_rollouts(
        self,
        *,
        status: RolloutStatus | Sequence[RolloutStatus] | None = None,
        group_id: str | None = None,
        mode: RolloutMode | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
    ) -> list[Rollout]:
        """Rollouts matching every given filter, in enqueue order (or its reverse)."""
        ...

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        """Cancel each rollout; a live attempt is marked ``failed`` with error "cancelled".

        Already cancelled rollouts are left as they are; a succeeded or failed one raises
        InvalidTransitionError, and then nothing is cancelled.
        """
        ...

    async def start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout:
        """Start a new attempt for a queued (``queuing``/``requeuing``) rollout, taking it off the queue."""
        ...

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | None = None,
        error: str | None = None,
        metadata: JsonDict | None = None,
    ) -> Attempt:
        """Change an attempt's status (following the attempt state machine), error or metadata.

        Any update counts as activity for the unresponsive watchdog. Ending the latest attempt
        ends, requeues or fails its rollout as the rollout state machine says. ``metadata`` must be a
        JSON object (merged into the attempt's); a NUL character in ``error`` is stored as U+FFFD.
        """
        ...

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """The rollout's attempts, first to latest."""
        ...

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans, allocating sequence ids; returns the stored spans in input order.

        Every span's rollout and attempt must exist. A span moves a ``preparing`` attempt (and its
        rollout) to ``running`` and counts as activity. Spans that arrive for an attempt that has
        already ended are kept (late traces are still worth seeing) and change no status.
        """
        ...

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> SpanList:
        """Spans of a rollout (all attempts, one attempt, or the latest), by attempt then sequence id.

        Its ``spans_unreadable`` counts the span records skipped because they no longer read back.
        """
        ...

    async def put_resources(self, resources: Resources, resources_id: str | None = None) -> ResourcesVersion:
        """Store resources as the new latest version (replacing ``resources_id`` if given and known)."""
        ...

    async def get_resources(self, resources_id: str | None = None) -> ResourcesVersion | None:
        """Resources by id (NotFoundError if unknown), or the latest (None when none exist yet)."""
        ...

    async def heartbeat(
        self, worker_id: str, stats: JsonDict | None = None, attempt_ids: Sequence[str] | None = None
    ) -> Worker:
        """Record that a worker is alive; counts as activity for its live attempts.

        With ``attempt_ids`` (a list), only those of the worker's live attempts are refreshed: a
        worker names the attempts it is running, so one it never heard of (a claim whose answer was
        lost and whose retry reached another server claimed twice) goes unresponsive after
        ``unresponsive_seconds`` and is retried as ``max_attempts`` allows. Ids that are not live
        attempts of this worker are ignored. ``None`` refreshes every live attempt it owns.
        """
        ...

    async def list_workers(self) -> list[Worker]:
        """Workers that have sent a heartbeat or claimed work, by first appearance."""
        ...

    async def wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        """Sleep until every listed rollout is terminal or the timeout passes; returns the terminal ones."""
        ...

    async def stats(self) -> StoreStats:
        """Counts of rollouts and attempts per status, spans, workers and resources versions."""
        ...

    async def close(self) -> None:
        """Release files and connections; the store cannot be used afterwards."""
        ...
