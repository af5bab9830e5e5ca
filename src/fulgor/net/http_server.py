"""A minimal HTTP/1.1 server on asyncio streams, for small endpoints that must answer in microseconds.

It parses one request at a time per connection (keep-alive), hands an :class:`HttpRequest` to a
handler and writes the :class:`HttpReply` it returns: a whole body with ``Content-Length``, or an
async iterator of chunks sent with chunked transfer encoding (server-sent events). It answers
``Expect: 100-continue``, refuses bodies over ``max_body_bytes`` with 413 and malformed requests with
400, itself. It knows nothing of what it serves: the runner's reward endpoint
(:mod:`fulgor.runner.subprocess_agent`) and the scripted OpenAI server
(:mod:`fulgor.testing.openai_server`) build on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["Handler", "HttpReply", "HttpRequest", "error_reply", "serve_http"]

logger = logging.getLogger(__name__)

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
}


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    reader: asyncio.StreamReader = field(repr=False)

    def peer_closed(self) -> bool:
        """True once the client has closed its side of the connection."""
        return self.reader.at_eof()


@dataclass
class HttpReply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[HttpRequest], Awaitable[HttpReply]]


def error_reply(status: int, code: str, message: str) -> HttpReply:
    """A JSON ``{"error": {"code", "message"}}`` reply."""
    return HttpReply(status, json.dumps({"error": {"code": code, "message": message}}).encode())


async def serve_http(
    handler: Handler, host: str, port: int, *, max_body_bytes: int | None = None
) -> asyncio.Server:
    """Start serving on ``host:port`` (0 picks a free port); the caller closes the server."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Nobody awaits this task: asyncio's callback on it reports a cancelled one as "Exception in
        # callback" (Python 3.11), so cancellation (the loop shutting down) ends it quietly instead.
        try:
            while await _serve_one(handler, reader, writer, max_body_bytes):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    return await asyncio.start_server(on_connection, host, port, limit=2**24)


async def _serve_one(
    handler: Handler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_body_bytes: int | None
) -> bool:
    """Serve one request; whether the connection stays open for another."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    try:
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _version = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
    except ValueError:
        await _write(writer, error_reply(400, "bad_request", "malformed HTTP request"), close=True)
        return False
    if max_body_bytes is not None and length > max_body_bytes:
        message = f"the body may be at most {max_body_bytes} bytes"
        await _write(writer, error_reply(413, "too_large", message), close=True)
        return False
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await reader.readexactly(length) if length else b""
    reply = await handler(HttpRequest(method, path, headers, body, reader))
    await _write(writer, reply)
    return headers.get("connection", "").lower() != "close"


async def _write(writer: asyncio.StreamWriter, reply: HttpReply, *, close: bool = False) -> None:
    lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
    lines.append(f"content-type: {reply.content_type}")
    lines.extend(f"{name}: {value}" for name, value in reply.headers.items())
    if close:
        lines.append("connection: close")
    if reply.stream is None:
        lines.append(f"content-length: {len(reply.body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body)
        await writer.drain()
        return
    lines.append("transfer-encoding: chunked")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    async for chunk in reply.stream:
        if chunk:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
