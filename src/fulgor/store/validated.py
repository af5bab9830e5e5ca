"""ValidatedStore: the one layer that checks every store operation's input, under every backend.

Each public operation of :class:`~fulgor.store.base.Store` is written here once: it validates its
arguments with the shared rules (:mod:`fulgor.store._rules`), normalises them (an error string
without NUL characters, metadata as JSON gives it back, statuses as a set) and hands them to the
backend's storage method of the same name with a leading underscore. A backend subclasses it and
writes only its storage; whatever reaches a storage method has passed the checks, so a call that
raises ValidationError has written nothing anywhere, and nothing past the limits of
:mod:`fulgor.limits` is ever stored. Reads hand back what still reads: ``query_spans`` skips span
records an older version stored past those limits, counts them in the answer's
``spans_unreadable`` and logs them. The conformance suite in
``tests/unit/store`` holds every backend to the same answers.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal

from fulgor.store import _rules as rules
from fulgor.store.base import SpanList
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

__all__ = ["ValidatedStore"]

logger = logging.getLogger(__name__)

Statuses = frozenset[str] | None


class ValidatedStore(ABC):
    """The Store operations, validated once; subclasses implement the ``_``-prefixed storage methods."""

    # -- rollouts ---------------------------------------------------------------------------------

    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        rules.check_requests(requests)
        return await self._enqueue(requests)

    async def start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout:
        rules.check_requests([request])
        rules.check_worker_id(worker_id)
        return await self._start_rollout(request, worker_id)

    async def claim(self, worker_id: str, limit: int = 1, wait_seconds: float = 0) -> list[AttemptedRollout]:
        rules.check_claim_args(worker_id, limit, wait_seconds)
        return await self._claim(worker_id, limit, wait_seconds)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        rules.check_text(rollout_id, "rollout_id")
        return await self._get_rollout(rollout_id)

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
        rules.check_page(limit, offset, order)
        if group_id is not None:
            rules.check_text(group_id, "group_id")
        return await self._query_rollouts(rules.statuses_filter(status), group_id, mode, limit, offset, order)

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        rules.check_ids(rollout_ids, "rollout_ids")
        return await self._cancel(rollout_ids)

    async def start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout:
        rules.check_text(rollout_id, "rollout_id")
        rules.check_worker_id(worker_id)
        return await self._start_attempt(rollout_id, worker_id)

    # -- attempts ---------------------------------------------------------------------------------

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | None = None,
        error: str | None = None,
        metadata: JsonDict | None = None,
    ) -> Attempt:
        error, metadata = rules.check_attempt_update(rollout_id, attempt_id, status, error, metadata)
        return await self._update_attempt(rollout_id, attempt_id, status, error, metadata)

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        rules.check_text(rollout_id, "rollout_id")
        return await self._list_attempts(rollout_id)

    # -- spans ------------------------------------------------------------------------------------

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        rules.check_spans(spans)
        return await self._add_spans(spans)

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        name: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> SpanList:
        rules.check_span_query(rollout_id, attempt_id, name, limit, offset)
        spans = await self._query_spans(rollout_id, attempt_id, name, limit, offset)
        if not isinstance(spans, SpanList):  # a backend that cannot hold an unreadable record
            return SpanList(spans)
        if spans.spans_unreadable:
            logger.warning(
                "%d stored span(s) of rollout %s no longer read back (stored past fulgor.limits by "
                "an older version); skipped, and counted in spans_unreadable",
                spans.spans_unreadable,
                rollout_id,
            )
        return spans

    # -- resources --------------------------------------------------------------------------------

    async def put_resources(self, resources: Resources, resources_id: str | None = None) -> ResourcesVersion:
        rules.check_resources(resources, resources_id)
        return await self._put_resources(resources, resources_id)

    async def get_resources(self, resources_id: str | None = None) -> ResourcesVersion | None:
        if resources_id is not None:
            rules.check_text(resources_id, "resources_id")
        return await self._get_resources(resources_id)

    # -- workers, waiting, stats ------------------------------------------------------------------

    async def heartbeat(
        self, worker_id: str, stats: JsonDict | None = None, attempt_ids: Sequence[str] | None = None
    ) -> Worker:
        rules.check_heartbeat(worker_id, stats, attempt_ids)
        return await self._heartbeat(worker_id, stats, attempt_ids)

    async def list_workers(self) -> list[Worker]:
        return await self._list_workers()

    async def wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        rules.check_seconds(timeout_seconds, "timeout_seconds")
        rules.check_ids(rollout_ids, "rollout_ids")
        return await self._wait(rollout_ids, timeout_seconds)

    async def stats(self) -> StoreStats:
        return await self._stats()

    @abstractmethod
    async def close(self) -> None:
        """Release files and connections; the store cannot be used afterwards."""

    # -- storage: what a backend writes ------------------------------------------------------------

    @abstractmethod
    async def _enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]: ...

    @abstractmethod
    async def _start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout: ...

    @abstractmethod
    async def _claim(self, worker_id: str, limit: int, wait_seconds: float) -> list[AttemptedRollout]: ...

    @abstractmethod
    async def _get_rollout(self, rollout_id: str) -> Rollout: ...

    @abstractmethod
    async def _query_rollouts(
        self,
        statuses: Statuses,
        group_id: str | None,
        mode: RolloutMode | None,
        limit: int | None,
        offset: int,
        order: Literal["asc", "desc"],
    ) -> list[Rollout]: ...

    @abstractmethod
    async def _cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]: ...

    @abstractmethod
    async def _start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout: ...

    @abstractmethod
    async def _update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | None,
        error: str | None,
        metadata: JsonDict | None,
    ) -> Attempt: ...

    @abstractmethod
    async def _list_attempts(self, rollout_id: str) -> list[Attempt]: ...

    @abstractmethod
    async def _add_spans(self, spans: Sequence[Span]) -> list[Span]: ...

    @abstractmethod
    async def _query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None,
        name: str | None,
        limit: int | None,
        offset: int,
    ) -> list[Span]: ...

    @abstractmethod
    async def _put_resources(self, resources: Resources, resources_id: str | None) -> ResourcesVersion: ...

    @abstractmethod
    async def _get_resources(self, resources_id: str | None) -> ResourcesVersion | None: ...

    @abstractmethod
    async def _heartbeat(
        self, worker_id: str, stats: JsonDict | None, attempt_ids: Sequence[str] | None
    ) -> Worker: ...

    @abstractmethod
    async def _list_workers(self) -> list[Worker]: ...

    @abstractmethod
    async def _wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]: ...

    @abstractmethod
    async def _stats(self) -> StoreStats: ...
