"""A minimal HTTP/1.1 server on asyncio streams, for small endpoints that must answer in microseconds.

It parses one request at a time per connection (keep-alive), hands an :class:`HttpRequest` to a
handler and writes the :class:`HttpReply` it returns: a whole body with ``Content-Length``, or an
async iterator of chunks sent with chunked transfer encoding (server-sent events). It answers
``Expect: 100-continue``, refuses bodies over ``max_body_bytes`` with 413 and malformed requests with
400, itself. Closing the server also closes its idle keep-alive connections (a request in progress
finishes first), so ``wait_closed()`` does not wait on clients that keep one open. It knows nothing
of what it serves: the runner's reward endpoint (:mod:`fulgor.runner.subprocess_agent`) and the
scripted OpenAI server (:mod:`fulgor.testing.openai_server`) build on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["Handler", "HttpReply", "HttpRequest", "HttpServer", "error_reply", "serve_http"]

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


class HttpServer:
    """A server :func:`serve_http` started: ``close()`` stops listening and closes idle connections.

    asyncio's own ``Server.close()`` leaves accepted connections open, and from Python 3.12 its
    ``wait_closed()`` waits until every client has closed its keep-alive connection.
    """

    def __init__(self, server: asyncio.Server, connections: _Connections) -> None:
        self._server = server
        self._connections = connections

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return self._server.sockets

    def close(self) -> None:
        """Stop accepting connections and close the idle ones; a request in progress finishes first."""
        self._server.close()
        self._connections.closing = True
        for writer in list(self._connections.idle):
            writer.close()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


@dataclass
class _Connections:
    """The connections waiting for their next request, and whether the server is closing."""

    idle: set[asyncio.StreamWriter] = field(default_factory=set)
    closing: bool = False


async def serve_http(
    handler: Handler, host: str, port: int, *, max_body_bytes: int | None = None
) -> HttpServer:
    """Start serving on ``host:port`` (0 picks a free port); the caller closes the server."""
    connections = _Connections()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Nobody awaits this task: asyncio's callback on it reports a cancelled one as "Exception in
        # callback" (Python 3.11), so cancellation (the loop shutting down) ends it quietly instead.
        try:
            while not connections.closing and await _serve_one(
                handler, reader, writer, max_body_bytes, connections
            ):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    server = await asyncio.start_server(on_connection, host, port, limit=2**24)
    return HttpServer(server, connections)


async def _serve_one(
    handler: Handler,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    max_body_bytes: int | None,
    connections: _Connections,
) -> bool:
    """Serve one request; whether the connection stays open for another."""
    connections.idle.add(writer)  # until the next request's head has arrived: close() may close it
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    finally:
        connections.idle.discard(writer)
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
    # Closed meanwhile: this reply is the connection's last, and says so.
    await _write(writer, reply, close=connections.closing)
    return not connections.closing and headers.get("connection", "").lower() != "close"


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
