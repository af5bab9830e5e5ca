"""StoreClient: the Store protocol over HTTP, talking to ``fulgor serve``.

Runners, gateways and agents in other processes or on other machines use it exactly like a local
store; errors come back as the same fulgor exception classes (NotFoundError, ValidationError,
InvalidTransitionError). For blocking code wrap it: ``SyncStore(StoreClient(url))``, or use
``open_store("http://HOST:PORT")``.

Reliability: connection failures and 502/503/504 answers (503 is also how a server says its
database is unavailable) are retried with exponential backoff, a bounded number of times. Writes
that are not naturally idempotent carry an ``Idempotency-Key`` header, so the server answers a
retry with the first answer instead of running it twice (span adds need none: the store keeps one
span per span_id). Servers remember keys in their own memory: a retry that reaches a restarted or
another server runs again (a claim may then take a second rollout; see ``Store.heartbeat``'s
``attempt_ids``). Long waits (``claim(wait_seconds=...)``, ``wait``) are held by the server in
chunks of at most ``long_poll_seconds``, and the client asks again until its own deadline: nothing
busy-polls.

Speed: a small keep-alive HTTP/1.1 client (:mod:`fulgor.net.http_client`) and request bodies built
from pre-serialised JSON. Needs no extra packages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlencode

import pydantic
from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError

from fulgor.errors import (
    ConfigError,
    InvalidTransitionError,
    NotFoundError,
    StoreError,
    StoreUnavailableError,
    ValidationError,
)
from fulgor.net.http_client import HttpClient, split_url
from fulgor.store import http_api as api
from fulgor.store.base import SpanList
from fulgor.store.validated import ValidatedStore
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
    Span,
    StoreStats,
    Worker,
)

__all__ = ["StoreClient", "StoreServerError", "StoreUnreachableError"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

TOKEN_ENV = "FULGOR_TOKEN"
_RETRY_STATUSES = frozenset({502, 503, 504})


class StoreUnreachableError(StoreUnavailableError):
    """The server could not be reached, or kept failing, after every retry.

    A server whose store is itself a client (a proxy) answers it with 503, like any unavailable store.
    """

    code = "store_unreachable"


class StoreServerError(StoreError):
    """The server refused a request for a reason no other fulgor error stands for (auth, size, ...)."""

    code = "store_server_error"

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class StoreClient(ValidatedStore):
    """A :class:`~fulgor.store.base.Store` whose state lives behind ``fulgor serve`` at ``url``.

    ``token`` defaults to the ``FULGOR_TOKEN`` environment variable. One client may be shared by
    any number of tasks on one event loop; each request in flight uses its own connection.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_seconds: float = 60.0,
        max_retries: int = 8,
        backoff_max_seconds: float = 2.0,
        long_poll_seconds: float = 25.0,
    ) -> None:
        self.url = url.rstrip("/")
        try:
            self._origin, self._base_path = split_url(self.url)
        except ValueError:
            raise ConfigError(
                f"server URL {url!r} must look like http://HOST:PORT or https://HOST:PORT"
            ) from None
        self._http = HttpClient(
            connect_timeout_seconds=timeout_seconds,
            read_timeout_seconds=timeout_seconds,
            max_idle_per_origin=32,
        )
        token = token if token is not None else os.environ.get(TOKEN_ENV, "").strip() or None
        self._auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.backoff_max_seconds = backoff_max_seconds
        self.long_poll_seconds = long_poll_seconds

    # -- rollouts ---------------------------------------------------------------------------------

    async def _enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        body = _object(requests=_models("requests", requests))
        return await self._call("POST", "/rollouts", api.ROLLOUTS, body, idempotent=True)

    async def _start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout:
        body = _object(request=_model("request", request), worker_id=_plain("worker_id", worker_id))
        return await self._call("POST", "/rollouts/start", api.ATTEMPTED, body, idempotent=True)

    async def _claim(self, worker_id: str, limit: int, wait_seconds: float) -> list[AttemptedRollout]:
        deadline = time.monotonic() + wait_seconds
        while True:
            chunk = max(0.0, min(deadline - time.monotonic(), self.long_poll_seconds))
            body = _object(
                worker_id=_plain("worker_id", worker_id),
                limit=_plain("limit", limit),
                wait_seconds=_plain("wait_seconds", chunk),
            )
            claimed = await self._call(
                "POST", "/rollouts/claim", api.ATTEMPTEDS, body, idempotent=True, wait_seconds=chunk
            )
            if claimed or time.monotonic() >= deadline:
                return claimed

    async def _get_rollout(self, rollout_id: str) -> Rollout:
        return await self._call("GET", f"/rollouts/{_id(rollout_id)}", api.ROLLOUT)

    async def _query_rollouts(
        self,
        statuses: frozenset[str] | None,
        group_id: str | None,
        mode: RolloutMode | None,
        limit: int | None,
        offset: int,
        order: Literal["asc", "desc"],
    ) -> list[Rollout]:
        # One empty value stands for an empty set of statuses, which matches nothing.
        status = None if statuses is None else sorted(statuses) or [""]
        query = _query(status=status, group_id=group_id, mode=mode, limit=limit, offset=offset, order=order)
        return await self._call("GET", f"/rollouts{query}", api.ROLLOUTS)

    async def _cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        body = _object(rollout_ids=_plain("rollout_ids", list(rollout_ids)))
        return await self._call("POST", "/rollouts/cancel", api.ROLLOUTS, body, idempotent=True)

    async def _start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout:
        body = _object(worker_id=_plain("worker_id", worker_id))
        path = f"/rollouts/{_id(rollout_id)}/attempts"
        return await self._call("POST", path, api.ATTEMPTED, body, idempotent=True)

    # -- attempts ---------------------------------------------------------------------------------

    async def _update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | None,
        error: str | None,
        metadata: JsonDict | None,
    ) -> Attempt:
        body = _object(
            status=_plain("status", status),
            error=_plain("error", error),
            metadata=_plain("metadata", metadata),
        )
        path = f"/rollouts/{_id(rollout_id)}/attempts/{_id(attempt_id)}"
        return await self._call("PATCH", path, api.ATTEMPT, body, idempotent=True)

    async def _list_attempts(self, rollout_id: str) -> list[Attempt]:
        return await self._call("GET", f"/rollouts/{_id(rollout_id)}/attempts", api.ATTEMPTS)

    # -- spans ------------------------------------------------------------------------------------

    async def _add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans in one request; a retry never duplicates (the store keeps one span per span_id)."""
        return await self._call("POST", "/spans", api.SPANS, _object(spans=_models("spans", spans)))

    async def _query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None,
        name: str | None,
        limit: int | None,
        offset: int,
    ) -> SpanList:
        query = _query(attempt_id=attempt_id, name=name, limit=limit, offset=offset)
        path = api.PREFIX + f"/rollouts/{_id(rollout_id)}/spans{query}"
        status, content, headers = await self._send("GET", path, self._auth, None, self.timeout_seconds)
        if status >= 400:
            raise _error(status, content)
        spans = _span_list(content)
        spans.spans_unreadable += _count(headers.get(api.SPANS_UNREADABLE_HEADER.lower()))
        return spans

    # -- resources --------------------------------------------------------------------------------

    async def _put_resources(self, resources: Resources, resources_id: str | None) -> ResourcesVersion:
        items = b",".join(
            _plain("resources", name).encode() + b":" + _model(f"resources[{name!r}]", resource)
            for name, resource in resources.items()
        )
        body = _object(resources=b"{" + items + b"}", resources_id=_plain("resources_id", resources_id))
        return await self._call("POST", "/resources", api.RESOURCES_VERSION, body, idempotent=True)

    async def _get_resources(self, resources_id: str | None) -> ResourcesVersion | None:
        return await self._call(
            "GET", f"/resources{_query(resources_id=resources_id)}", api.MAYBE_RESOURCES_VERSION
        )

    # -- workers, waiting, stats -------------------------------------------------------------------

    async def _heartbeat(
        self, worker_id: str, stats: JsonDict | None, attempt_ids: Sequence[str] | None
    ) -> Worker:
        fields = {"worker_id": _plain("worker_id", worker_id), "stats": _plain("stats", stats)}
        if attempt_ids is not None:  # left out otherwise, so servers that predate it take the request
            fields["attempt_ids"] = _plain("attempt_ids", list(attempt_ids))
        return await self._call("POST", "/workers/heartbeat", api.WORKER, _object(**fields))

    async def _list_workers(self) -> list[Worker]:
        return await self._call("GET", "/workers", api.WORKERS)

    async def _wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        ids = _plain("rollout_ids", list(rollout_ids))
        deadline = time.monotonic() + timeout_seconds
        while True:
            chunk = max(0.0, min(deadline - time.monotonic(), self.long_poll_seconds))
            body = _object(rollout_ids=ids, timeout_seconds=_plain("timeout_seconds", chunk))
            done = await self._call("POST", "/rollouts/wait", api.ROLLOUTS, body, wait_seconds=chunk)
            if len(done) == len(rollout_ids) or time.monotonic() >= deadline:
                return done

    async def _stats(self) -> StoreStats:
        return await self._call("GET", "/stats", api.STATS)

    async def close(self) -> None:
        """Close idle connections; the server and its store keep running."""
        await self._http.close()

    # -- transport --------------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        adapter: TypeAdapter[T],
        body: bytes | None = None,
        *,
        idempotent: bool = False,
        wait_seconds: float = 0.0,
    ) -> T:
        headers = self._auth
        if body is not None:
            headers += "Content-Type: application/json\r\n"
        if idempotent:
            headers += f"{api.IDEMPOTENCY_HEADER}: {uuid.uuid4().hex}\r\n"
        target = api.PREFIX + path
        status, content, _ = await self._send(
            method, target, headers, body, self.timeout_seconds + wait_seconds
        )
        if status >= 400:
            raise _error(status, content)
        return adapter.validate_json(content)

    async def _send(
        self, method: str, target: str, headers: str, body: bytes | None, timeout_seconds: float
    ) -> tuple[int, bytes, dict[str, str]]:
        """The response's status, body and headers, retrying connection failures and 502/503/504
        with backoff."""
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._http.request(
                    method,
                    self._origin,
                    self._base_path + target,
                    headers,
                    body or b"",
                    timeout_seconds=timeout_seconds,
                )
                content = await response.read()
            except OSError as error:
                problem = str(error) or type(error).__name__
            else:
                if response.status not in _RETRY_STATUSES:
                    return response.status, content, response.headers
                problem = f"HTTP {response.status}{_message(content)}"
            if attempt == self.max_retries:
                break
            delay = min(self.backoff_max_seconds, 0.05 * 2**attempt) * random.uniform(0.5, 1.0)
            logger.debug("%s %s failed (%s); retrying in %.2f s", method, target, problem, delay)
            await asyncio.sleep(delay)
        raise StoreUnreachableError(
            f"{method} {self.url}{target} failed after {self.max_retries + 1} tries ({problem}); "
            "check that `fulgor serve` is running at that URL"
        )


def _span_list(content: bytes) -> SpanList:
    """The spans of a query's answer. A server reads each span from its store, but the answer's
    list adds a level of nesting: a span an older version stored just under pydantic's nesting limit
    reads there and not here. Then the spans are read one by one and such a one is counted."""
    try:
        return SpanList(api.SPANS.validate_json(content))
    except pydantic.ValidationError:
        pass
    try:
        items = json.loads(content)
    except (ValueError, RecursionError):
        items = None
    if not isinstance(items, list):
        raise ValidationError("the server answered a span query with something that is not a list of spans")
    spans = SpanList()
    for item in items:
        try:
            spans.append(Span.model_validate(item))
        except pydantic.ValidationError:
            spans.spans_unreadable += 1
    return spans


def _count(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() and len(value) < 19 else 0


def _message(body: bytes) -> str:
    """``: message`` of a fulgor error body (a 503 says which database is down), else nothing."""
    try:
        return f": {api.ErrorBody.model_validate_json(body).error.message}"
    except ValueError:
        return ""


def _error(status: int, body: bytes) -> StoreError | ValidationError:
    """The fulgor error a 4xx/5xx response stands for."""
    try:
        detail = api.ErrorBody.model_validate_json(body).error
    except ValueError:
        text = body[:200].decode("utf-8", "replace")
        return StoreServerError(status, "http_error", f"HTTP {status} without a fulgor error body: {text}")
    if detail.code == NotFoundError.code:
        return NotFoundError(detail.message)
    if detail.code == ValidationError.code:
        return ValidationError(detail.message)
    if detail.code == InvalidTransitionError.code and detail.details is not None:
        d = detail.details
        return InvalidTransitionError(d["kind"], d["object_id"], d["from_status"], d["to_status"])
    return StoreServerError(status, detail.code, detail.message)


# -- request building -------------------------------------------------------------------------------


def _id(value: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"ids must be strings, got {type(value).__name__}")
    return quote(value, safe="")


def _query(**params: Any) -> str:
    pairs = [
        (name, str(item))
        for name, value in params.items()
        if value is not None
        for item in (value if isinstance(value, list | tuple) else [value])
    ]
    return f"?{urlencode(pairs)}" if pairs else ""


def _object(**fields: bytes | str) -> bytes:
    """A JSON object from already-serialised member values."""
    members = [
        json.dumps(name).encode() + b":" + (value if isinstance(value, bytes) else value.encode())
        for name, value in fields.items()
    ]
    return b"{" + b",".join(members) + b"}"


def _plain(field: str, value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValidationError(f"{field} must be JSON-serialisable: {error}") from None


def _model(field: str, model: BaseModel) -> bytes:
    """A model as JSON; a value that cannot be serialised raises ValidationError naming its field."""
    try:
        return model.__pydantic_serializer__.to_json(model)
    except PydanticSerializationError as error:
        for name in type(model).model_fields:
            try:
                model.__pydantic_serializer__.to_json(model, include={name})
            except PydanticSerializationError:
                raise ValidationError(f"{field}.{name} must be JSON-serialisable: {error}") from None
        raise ValidationError(f"{field} must be JSON-serialisable: {error}") from None


def _models(field: str, models: Sequence[BaseModel]) -> bytes:
    return b"[" + b",".join(_model(f"{field}[{i}]", model) for i, model in enumerate(models)) + b"]"
