"""A minimal HTTP/1.1 server on asyncio streams, for fakes that must answer in microseconds.

It parses one request at a time per connection (keep-alive), hands ``(method, path, headers,
body)`` to a handler and writes what the handler returns: a whole body with ``Content-Length``,
or an async iterator of chunks sent with chunked transfer encoding (server-sent events). It knows
nothing of OpenAI; :mod:`fulgor.testing.openai_server` builds on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["HttpRequest", "HttpResponse", "serve_http"]

logger = logging.getLogger(__name__)

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Error"}


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
class HttpResponse:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


async def serve_http(handler: Handler, host: str, port: int) -> asyncio.Server:
    """Start serving on ``host:port`` (0 picks a free port); the caller closes the server."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await _serve_one(handler, reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(on_connection, host, port, limit=2**24)


async def _serve_one(handler: Handler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, path, _version = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    response = await handler(HttpRequest(method, path, headers, body, reader))
    await _write(writer, response)
    return headers.get("connection", "").lower() != "close"


async def _write(writer: asyncio.StreamWriter, response: HttpResponse) -> None:
    lines = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}"]
    lines.append(f"content-type: {response.content_type}")
    lines.extend(f"{name}: {value}" for name, value in response.headers.items())
    if response.stream is None:
        lines.append(f"content-length: {len(response.body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body)
        await writer.drain()
        return
    lines.append("transfer-encoding: chunked")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    async for chunk in response.stream:
        if chunk:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
