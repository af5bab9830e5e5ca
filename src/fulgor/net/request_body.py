"""Reading a request body from an ASGI ``receive``: at most so many bytes, each part within so
many seconds.

Every server of fulgor reads bodies here (the store server, the gateway, the engine), so a client
that sends too much, stops halfway or goes away is answered the same everywhere: each server maps
these errors to its own error shape (413, 408, 400). uvicorn waits for a body as long as the
connection stays open; the timeout is what keeps a slow or stalled client from holding a
connection and a task. It knows nothing of the apps that use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fulgor.errors import FulgorError

__all__ = [
    "RequestIncompleteError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "read_body",
    "timed_receive",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


class RequestTooLargeError(FulgorError):
    """A request body is larger than the server accepts."""

    code = "payload_too_large"


class RequestIncompleteError(FulgorError):
    """The client went away before its request body had arrived."""

    code = "request_incomplete"


class RequestTimeoutError(FulgorError):
    """The next part of a request body did not arrive in time; the connection is closed after the
    answer, since the rest of the body may still come."""

    code = "request_timeout"


async def read_body(receive: Receive, max_body_bytes: int, timeout_seconds: float | None = None) -> bytes:
    """The whole request body, at most ``max_body_bytes`` (RequestTooLargeError past it, however it
    is sent), each part within ``timeout_seconds`` of the one before (RequestTimeoutError);
    RequestIncompleteError when the client goes before sending it all."""
    parts: list[bytes] = []
    received = 0
    while True:
        message = await _next(receive, timeout_seconds)
        if message["type"] == "http.disconnect":
            raise RequestIncompleteError("the client disconnected before sending the whole request body")
        part = message.get("body", b"")
        received += len(part)
        if received > max_body_bytes:
            raise too_large(max_body_bytes)
        parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def too_large(max_body_bytes: int) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"request body is larger than {max_body_bytes} bytes, the server's limit; send less per "
        "request, or start the server with a larger limit"
    )


def timed_receive(receive: Receive, timeout_seconds: float) -> Receive:
    """``receive``, raising RequestTimeoutError when a part of the body takes longer than
    ``timeout_seconds``. Once the body is whole it waits as long as ``receive`` does: what follows is
    the wait for a disconnect, which a streamed answer or a long-poll may rightly hold for minutes."""
    whole = False

    async def timed() -> Message:
        nonlocal whole
        if whole:
            return await receive()
        message = await _next(receive, timeout_seconds)
        whole = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return timed


async def _next(receive: Receive, timeout_seconds: float | None) -> Message:
    if timeout_seconds is None:
        return await receive()
    try:
        async with asyncio.timeout(timeout_seconds):
            return await receive()
    except TimeoutError:
        raise RequestTimeoutError(
            f"no part of the request body arrived for {timeout_seconds:g} seconds; send the whole body "
            "without pausing"
        ) from None
