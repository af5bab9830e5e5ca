"""Server plumbing shared by every route: the server's config and state, errors as
``{"error": {"code", "message"}}`` bodies, auth, body limits, idempotency and long-poll draining.

The store routes (:mod:`fulgor.store._store_api`), OTLP ingestion (:mod:`fulgor.store.otlp`) and
the app (:mod:`fulgor.store.server`) use these pieces; nothing here knows a store operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import pydantic
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fulgor.errors import (
    FulgorError,
    InvalidTransitionError,
    NotFoundError,
    StoreUnavailableError,
    ValidationError,
)
from fulgor.store import _api as api
from fulgor.store.base import Store

T = TypeVar("T")

JSON = "application/json"
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


@dataclass
class ServerConfig:
    """What the store server serves and how; the app owns ``store`` and closes it on shutdown."""

    store: Store
    token: str | None = field(default=None, repr=False)
    max_body_bytes: int = 32 * 1024 * 1024
    max_wait_seconds: float = 30.0
    idempotency_entries: int = 10_000


class RequestTooLargeError(FulgorError):
    """A request body is larger than the server accepts."""

    code = "payload_too_large"


class RequestIncompleteError(FulgorError):
    """The client went away before its request body had arrived."""

    code = "request_incomplete"


class UnsupportedMediaTypeError(FulgorError):
    """A request body comes in a content type the route does not read."""

    code = "unsupported_media_type"


def status_for(error: FulgorError) -> int:
    """The HTTP status of a fulgor error; the one place where errors meet HTTP."""
    if isinstance(error, NotFoundError):
        return 404
    if isinstance(error, InvalidTransitionError):
        return 409
    if isinstance(error, RequestTooLargeError):
        return 413
    if isinstance(error, UnsupportedMediaTypeError):
        return 415
    if isinstance(error, StoreUnavailableError):
        return 503  # the database is down or unreachable: worth a retry, and never remembered
    return 400


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer (status, body, extra headers), sent as two ASGI messages.

    The store routes and the server's middleware answer with these directly, without a web
    framework's request and response objects; :meth:`response` turns one into a framework response.
    """

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()
    media_type: bytes = b"application/json"

    async def send(self, send: Send) -> None:
        headers = [(b"content-type", self.media_type), (b"content-length", b"%d" % len(self.body))]
        headers += self.headers
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})

    def response(self) -> Response:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in self.headers}
        return Response(self.body, self.status, headers, self.media_type.decode("latin-1"))


def error_answer(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    body = api.ErrorBody(error=api.ErrorDetail(code=code, message=message, details=details))
    extra = tuple(
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()
    )
    return Answer(status, body.model_dump_json(exclude_none=True).encode(), extra)


def internal_error_answer() -> Answer:
    """The 500 for a failure the server did not expect; the details go to its log, not the client."""
    return error_answer(500, "internal_error", "the server failed; see its log for details")


def fulgor_error_answer(error: FulgorError) -> Answer:
    details = None
    if isinstance(error, InvalidTransitionError):
        details = {
            "kind": error.kind,
            "object_id": error.object_id,
            "from_status": error.from_status,
            "to_status": error.to_status,
        }
    return error_answer(status_for(error), error.code, error.message, details)


def validation_error_answer(error: pydantic.ValidationError) -> Answer:
    """422 naming each offending field by its path, e.g. ``spans[1].start_time``."""
    problems = [
        {"field": api.field_path(tuple(item["loc"])), "message": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False, include_input=False)
    ]
    message = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5])
    if len(problems) > 5:
        message += f"; and {len(problems) - 5} more"
    return error_answer(422, ValidationError.code, message, {"errors": problems})


async def read_body(receive: Receive) -> bytes:
    """The whole request body; RequestIncompleteError when the client goes before sending it all.

    A FulgorError from a limit on ``receive`` (the body limit) propagates too.
    """
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestIncompleteError("the client disconnected before sending the whole request body")
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def read_query(query_string: bytes, model: type[T], list_fields: frozenset[str] = frozenset()) -> T:
    """Query parameters validated as ``model`` (unknown names are errors); ``list_fields`` may repeat."""
    values: dict[str, list[str]] = {}
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        values.setdefault(name, []).append(value)
    data = {name: items if name in list_fields else items[-1] for name, items in values.items()}
    result: T = model.model_validate(data)  # type: ignore[attr-defined]
    return result


async def guarded(make: Callable[[], Awaitable[Answer]]) -> Answer:
    """Run a route body, turning fulgor and pydantic errors into their 4xx answers."""
    try:
        return await make()
    except FulgorError as error:
        return fulgor_error_answer(error)
    except pydantic.ValidationError as error:
        return validation_error_answer(error)


class IdempotencyCache:
    """Remembers the responses to recent ``Idempotency-Key`` requests, so a retry gets the first answer.

    Kept in this process's memory, bounded to ``max_entries`` keys (oldest forgotten first): it
    protects retries against one server process, not across a restart or between several servers
    behind a load balancer. A retry that arrives while the first request is still running waits
    for the first one's answer instead of running twice. A key reused with a different body is
    refused (422). 5xx answers are not remembered.
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
                    f"this {key[2]!r} was already used for a different request; use a new key per request"
                )
                return error_answer(422, "idempotency_key_reused", message)
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


class Draining:
    """Set when the server starts to shut down, so long-polls answer at once instead of holding it up.

    Works across event loops and threads: ``begin`` may be called from a signal handler or another
    thread, and wakes every held request on whichever loop it waits. It takes no lock, so a signal
    landing anywhere in :meth:`hold` cannot deadlock: ``hold`` registers its waiter before it reads
    the flag and ``begin`` sets the flag before it reads the waiters, so one of them always sees
    the other (each step is one atomic operation under the GIL).
    """

    def __init__(self) -> None:
        self._begun = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    def begin(self) -> None:
        self._begun = True
        for loop, future in self._waiters.copy():
            with contextlib.suppress(RuntimeError):  # that loop closed meanwhile: nothing waits there
                loop.call_soon_threadsafe(_resolve, future)

    @property
    def begun(self) -> bool:
        return self._begun

    async def hold(self, work: Awaitable[T], fallback: Callable[[], Awaitable[T]]) -> T:
        """``work``'s result, or ``fallback()``'s when draining begins first (``work`` is cancelled)."""
        loop = asyncio.get_running_loop()
        drained: asyncio.Future[None] = loop.create_future()
        self._waiters.add((loop, drained))
        if self._begun:
            _resolve(drained)
        task = asyncio.ensure_future(work)
        either: set[asyncio.Future[Any]] = {task, drained}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._waiters.discard((loop, drained))
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled():
            return task.result()
        return await fallback()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass
class ServerState:
    """What every route reaches (as ``app.state.fulgor``): config, idempotency cache, draining flag."""

    config: ServerConfig
    idempotency: IdempotencyCache
    draining: Draining = field(default_factory=Draining)

    @property
    def store(self) -> Store:
        return self.config.store


class AuthMiddleware:
    """Bearer-token check on every HTTP route except health, the OpenAPI spec and the docs.

    401 when the ``Authorization`` header is missing or not a bearer token, 403 when the token is
    wrong; the comparison takes the same time wherever the tokens differ.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = header(scope, b"authorization")
        if given is None or given[:7].lower() != b"bearer ":
            answer = error_answer(
                401,
                "unauthorized",
                "this server needs a bearer token: send 'Authorization: Bearer TOKEN' "
                "(StoreClient(url, token=...) or the FULGOR_TOKEN environment variable)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        elif not hmac.compare_digest(b"Bearer " + given[7:], self._expected):
            answer = error_answer(403, "forbidden", "the bearer token is wrong; use the server's token")
        else:
            await self.app(scope, receive, send)
            return
        await answer.send(send)


class BodyLimitMiddleware:
    """413 for request bodies over ``max_body_bytes``, whether announced by Content-Length or streamed."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            if declared.isdigit():
                answer = fulgor_error_answer(self._too_large())
            else:
                answer = error_answer(400, "bad_request", "Content-Length must be a whole number")
            await answer.send(send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"request body is larger than {self.max_body_bytes} bytes; send fewer spans or rollouts per "
            "request, or start the server with a larger ServerConfig.max_body_bytes"
        )


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            result: bytes = value
            return result
    return None
