"""What every route of the server shares: ASGI types, whole answers, errors as
``{"error": {"code", "message"}}`` bodies, reading bodies and query strings, the bearer-token check.

Answers are built whole and sent as two ASGI messages, without a web framework's request and
response objects: a store call takes tens of microseconds, and a framework's layers around a route
cost more than the call. Nothing here knows a route.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import pydantic

from fulgor.errors import (
    FulgorError,
    InvalidTransitionError,
    NotFoundError,
    StoreUnavailableError,
    ValidationError,
)
from fulgor.net.request_body import RequestIncompleteError, RequestTimeoutError, RequestTooLargeError
from fulgor.net.request_body import read_body as read_body_within
from fulgor.store import http_api as api

__all__ = [
    "JSON",
    "ASGIApp",
    "Answer",
    "AttemptEndedError",
    "ForbiddenError",
    "Message",
    "Receive",
    "RequestIncompleteError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "Scope",
    "Send",
    "UnauthorizedError",
    "UnsupportedMediaTypeError",
    "check_token",
    "error_answer",
    "fulgor_error_answer",
    "guarded",
    "header",
    "internal_error_answer",
    "read_body",
    "read_query",
    "validation_error_answer",
]

T = TypeVar("T")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = "application/json"


class UnsupportedMediaTypeError(FulgorError):
    """A request body comes in a content type the route does not read."""

    code = "unsupported_media_type"


class UnauthorizedError(FulgorError):
    """The request carries no credential where one is needed."""

    code = "unauthorized"


class ForbiddenError(FulgorError):
    """The credential sent does not reach what the request asks for."""

    code = "forbidden"


class AttemptEndedError(FulgorError):
    """An attempt's credential was used after its attempt ended."""

    code = "attempt_ended"


def status_for(error: FulgorError) -> int:
    """The HTTP status of a fulgor error; the one place where errors meet HTTP."""
    if isinstance(error, NotFoundError):
        return 404
    if isinstance(error, InvalidTransitionError | AttemptEndedError):
        return 409
    if isinstance(error, UnauthorizedError):
        return 401
    if isinstance(error, ForbiddenError):
        return 403
    if isinstance(error, RequestTimeoutError):
        return 408
    if isinstance(error, RequestTooLargeError):
        return 413
    if isinstance(error, UnsupportedMediaTypeError):
        return 415
    if isinstance(error, StoreUnavailableError):
        return 503  # the database is down or unreachable: worth a retry, and never remembered
    return 400


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer (status, body, extra headers), sent as two ASGI messages."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()
    media_type: bytes = b"application/json"

    async def send(self, send: Send) -> None:
        headers = [(b"content-type", self.media_type), (b"content-length", b"%d" % len(self.body))]
        headers += self.headers
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


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
    # After a body that stopped coming the connection cannot carry another request: close it.
    headers = {"Connection": "close"} if isinstance(error, RequestTimeoutError) else None
    return error_answer(status_for(error), error.code, error.message, details, headers)


def validation_error_answer(error: pydantic.ValidationError) -> Answer:
    """400 naming each offending field by its path, e.g. ``spans[1].start_time``: the status of
    every validation error the server answers, as the store's own ValidationError gets."""
    problems = [
        {"field": api.field_path(tuple(item["loc"])), "message": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False, include_input=False)
    ]
    message = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:5])
    if len(problems) > 5:
        message += f"; and {len(problems) - 5} more"
    return error_answer(400, ValidationError.code, message, {"errors": problems})


async def guarded(make: Callable[[], Awaitable[Answer]]) -> Answer:
    """Run a route body, turning fulgor and pydantic errors into their 4xx (or 503) answers."""
    try:
        return await make()
    except FulgorError as error:
        return fulgor_error_answer(error)
    except pydantic.ValidationError as error:
        return validation_error_answer(error)


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            result: bytes = value
            return result
    return None


def declared_too_large(scope: Scope, max_body_bytes: int) -> Answer | None:
    """413 when ``Content-Length`` announces more than ``max_body_bytes`` (400 when it is no number)."""
    declared = header(scope, b"content-length")
    if declared is None or (declared.isdigit() and int(declared) <= max_body_bytes):
        return None
    if not declared.isdigit():
        return error_answer(400, "bad_request", "Content-Length must be a whole number")
    return fulgor_error_answer(_too_large(max_body_bytes))


async def read_body(receive: Receive, max_body_bytes: int) -> bytes:
    """The whole request body, at most ``max_body_bytes`` (RequestTooLargeError past it, however it
    is sent); RequestIncompleteError when the client goes before sending it all. The app's receive
    raises RequestTimeoutError for a body that stops coming (``ServerConfig.body_timeout_seconds``)."""
    try:
        return await read_body_within(receive, max_body_bytes)
    except RequestTooLargeError:
        raise _too_large(max_body_bytes) from None


def _too_large(max_body_bytes: int) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"request body is larger than {max_body_bytes} bytes; send fewer spans or rollouts per "
        "request, or start the server with a larger ServerConfig.max_body_bytes"
    )


def read_query(query_string: bytes, model: type[T], list_fields: frozenset[str] = frozenset()) -> T:
    """Query parameters validated as ``model`` (unknown names are errors); ``list_fields`` may repeat."""
    values: dict[str, list[str]] = {}
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        values.setdefault(name, []).append(value)
    data = {name: items if name in list_fields else items[-1] for name, items in values.items()}
    result: T = model.model_validate(data)  # type: ignore[attr-defined]
    return result


def check_token(scope: Scope, expected: bytes) -> Answer | None:
    """None when the request carries ``Authorization: Bearer`` with the server's token (``expected``
    is ``b"Bearer " + token``); else 401 (no bearer token) or 403 (a wrong one). The comparison
    takes the same time wherever the tokens differ."""
    given = header(scope, b"authorization")
    if given is None or given[:7].lower() != b"bearer ":
        return error_answer(
            401,
            "unauthorized",
            "this server needs a bearer token: send 'Authorization: Bearer TOKEN' "
            "(StoreClient(url, token=...) or the FULGOR_TOKEN environment variable)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(b"Bearer " + given[7:], expected):
        return error_answer(403, "forbidden", "the bearer token is wrong; use the server's token")
    return None
