"""A lean HTTP/1.1 client on asyncio streams, with keep-alive pooling, for upstream calls.

The gateway's cost per call is mostly the HTTP client it calls upstream with (benchmarks/gateway.py
compares httpx, aiohttp and this client): this one writes the request in one buffer, parses only
the status line and headers it needs, and hands the body over whole (``Content-Length``) or chunk
by chunk (chunked transfer encoding, as servers stream server-sent events). A connection goes back
to the pool once its body is read to the end; :meth:`UpstreamResponse.abort` closes it instead,
which is how a call is cancelled upstream when the agent goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["HttpClient", "UpstreamResponse"]

_Key = tuple[str, str, int]
_LIMIT = 2**26  # the longest header block or chunk-size line accepted


@dataclass
class _Connection:
    key: _Key
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


class UpstreamResponse:
    """Status, headers and a body to read once, whole (:meth:`read`) or in chunks (:meth:`chunks`)."""

    def __init__(
        self, client: HttpClient, connection: _Connection, status: int, headers: dict[str, str]
    ) -> None:
        self.status = status
        self.headers = headers
        self._client = client
        self._connection: _Connection | None = connection
        self._keep_alive = headers.get("connection", "").lower() != "close"

    async def read(self) -> bytes:
        """The whole body; the connection then returns to the pool."""
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; the connection returns to the pool after the last chunk."""
        connection = self._connection
        if connection is None:
            return
        timeout = self._client.read_timeout_seconds
        try:
            async for chunk in _body(connection.reader, self.headers, timeout):
                yield chunk
        except BaseException:
            self.abort()
            raise
        self._release()

    def abort(self) -> None:
        """Close the connection without reading further (cancels the call upstream)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        framed = "content-length" in self.headers or "chunked" in self.headers.get("transfer-encoding", "")
        if self._keep_alive and framed:
            self._client.release(connection)
        else:
            connection.close()


class HttpClient:
    """Pooled HTTP/1.1 connections per (scheme, host, port)."""

    def __init__(
        self,
        *,
        connect_timeout_seconds: float = 10.0,
        read_timeout_seconds: float = 600.0,
        max_idle_per_host: int = 256,
    ) -> None:
        self.connect_timeout_seconds = connect_timeout_seconds
        self.read_timeout_seconds = read_timeout_seconds
        self._max_idle = max_idle_per_host
        self._idle: dict[_Key, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self, method: str, key: _Key, path: str, headers: str, body: bytes = b""
    ) -> UpstreamResponse:
        """Send one request; ``headers`` is a pre-rendered block of ``Name: value\\r\\n`` lines.

        A pooled connection that the server closed while idle is replaced once, transparently.
        """
        _scheme, host, port = key
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
        ).encode("latin-1")
        connection, reused = await self._acquire(key)
        try:
            return await self._exchange(connection, head + body)
        except (ConnectionError, asyncio.IncompleteReadError):
            connection.close()
            if not reused:
                raise
        except BaseException:
            connection.close()
            raise
        connection = await self._connect(key)
        try:
            return await self._exchange(connection, head + body)
        except BaseException:
            connection.close()
            raise

    async def _exchange(self, connection: _Connection, payload: bytes) -> UpstreamResponse:
        connection.writer.write(payload)
        async with asyncio.timeout(self.read_timeout_seconds):
            head = await connection.reader.readuntil(b"\r\n\r\n")
        status, headers = _parse_head(head)
        return UpstreamResponse(self, connection, status, headers)

    async def _acquire(self, key: _Key) -> tuple[_Connection, bool]:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.writer.is_closing() and not connection.reader.at_eof():
                return connection, True
            connection.close()
        return await self._connect(key), False

    async def _connect(self, key: _Key) -> _Connection:
        scheme, host, port = key
        context = self._ssl_context() if scheme == "https" else None
        async with asyncio.timeout(self.connect_timeout_seconds):
            reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=_LIMIT)
        return _Connection(key, reader, writer)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def release(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) < self._max_idle:
            idle.append(connection)
        else:
            connection.close()

    async def close(self) -> None:
        """Close every pooled connection."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
                with contextlib.suppress(Exception):
                    await connection.writer.wait_closed()
        self._idle.clear()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, _, rest = head.partition(b"\r\n")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    for line in rest.split(b"\r\n"):
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return status, headers


async def _body(
    reader: asyncio.StreamReader, headers: dict[str, str], timeout_seconds: float
) -> AsyncIterator[bytes]:
    if "chunked" in headers.get("transfer-encoding", ""):
        async for chunk in _chunked(reader, timeout_seconds):
            yield chunk
        return
    length = headers.get("content-length")
    async with asyncio.timeout(timeout_seconds):
        if length is not None:
            yield await reader.readexactly(int(length)) if int(length) else b""
        else:
            yield await reader.read()


async def _chunked(reader: asyncio.StreamReader, timeout_seconds: float) -> AsyncIterator[bytes]:
    while True:
        async with asyncio.timeout(timeout_seconds):
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return
            data = await reader.readexactly(size + 2)
        yield data[:-2]
