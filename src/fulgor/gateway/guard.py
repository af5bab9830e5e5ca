"""RolloutGuard: a gateway URL is answered only for a live attempt of a rollout the store knows.

Calls to an unknown rollout or attempt get 404, calls to an ended attempt get 409, so an agent
cannot write into another rollout's record by mistake. A positive answer is cached for a short
time (``ttl_seconds``), so the store is asked about once per attempt and not on every call; a call
made within that time after the attempt ends is still recorded, as the store keeps late spans.
"""

from __future__ import annotations

import time

from fulgor.errors import NotFoundError
from fulgor.gateway.errors import RolloutFinishedError, RolloutNotFoundError
from fulgor.limits import quoted
from fulgor.store.base import Store

__all__ = ["RolloutGuard"]

_MAX_CACHED = 100_000


class RolloutGuard:
    def __init__(self, store: Store, ttl_seconds: float) -> None:
        self._store = store
        self._ttl = ttl_seconds
        self._live_until: dict[tuple[str, str], float] = {}

    async def check(self, rollout_id: str, attempt_id: str) -> None:
        """Raise RolloutNotFoundError (404) or RolloutFinishedError (409) unless the attempt is live."""
        key = (rollout_id, attempt_id)
        now = time.monotonic()
        if self._live_until.get(key, 0.0) > now:
            return
        try:
            attempts = await self._store.list_attempts(rollout_id)
        except NotFoundError:
            raise RolloutNotFoundError(
                f"rollout {quoted(rollout_id)} does not exist; use the base URL the runner handed to "
                "this agent"
            ) from None
        attempt = next((a for a in attempts if a.attempt_id == attempt_id), None)
        if attempt is None:
            raise RolloutNotFoundError(
                f"rollout {quoted(rollout_id)} has no attempt {quoted(attempt_id)}; "
                "use the base URL of the current attempt"
            )
        if not attempt.is_live:
            raise RolloutFinishedError(
                f"attempt {quoted(attempt_id)} of rollout {quoted(rollout_id)} has ended ({attempt.status}); "
                "it takes no more model calls"
            )
        if len(self._live_until) >= _MAX_CACHED:
            self._live_until.clear()
        self._live_until[key] = now + self._ttl
