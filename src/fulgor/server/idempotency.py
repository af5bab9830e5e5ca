"""Idempotency keys: a retried write gets the first answer instead of running twice."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from fulgor.limits import quoted
from fulgor.server.http import Answer, error_answer

__all__ = ["IdempotencyCache"]


class IdempotencyCache:
    """Remembers the responses to recent ``Idempotency-Key`` requests, so a retry gets the first answer.

    Kept in this process's memory, bounded to ``max_entries`` keys (oldest forgotten first): it
    protects retries against one server process, not across a restart or between several servers
    behind a load balancer. A retry that arrives while the first request is still running waits
    for the first one's answer instead of running twice. A key reused with a different body is
    refused with 400, the status of every request the server refuses as invalid. 5xx answers are
    not remembered.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str, str], tuple[bytes, asyncio.Future[Answer]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def run(
        self, key: tuple[str, str, str], body: bytes, make: Callable[[], Awaitable[Answer]]
    ) -> Answer:
        fingerprint = hashlib.sha256(body).digest()
        known = self._entries.get(key)
        if known is not None:
            if known[0] != fingerprint:
                message = (
                    f"this {quoted(key[2])} was already used for a different request; use a new key per "
                    "request"
                )
                return error_answer(400, "idempotency_key_reused", message)
            self._entries.move_to_end(key)
            return await asyncio.shield(known[1])
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._entries[key] = (fingerprint, future)
        try:
            answer = await make()
        except BaseException as error:
            self._forget(key, future, error)
            raise
        if answer.status >= 500:
            self._forget(key, future, None)
            return answer
        future.set_result(answer)
        self._evict()
        return answer

    def _forget(self, key: tuple[str, str, str], future: asyncio.Future[Answer], error: Any) -> None:
        self._entries.pop(key, None)
        if isinstance(error, Exception):
            future.set_exception(error)
            future.exception()  # retrieved here, so an unawaited future logs nothing
        else:
            future.cancel()

    def _evict(self) -> None:
        while len(self._entries) > self._max_entries:
            oldest_key = next(iter(self._entries))
            if not self._entries[oldest_key][1].done():
                break
            del self._entries[oldest_key]
