"""A lean HTTP/1.1 client on asyncio streams, with keep-alive connections pooled per origin.

The store client sends many small requests and the gateway's cost per call is mostly the client it
calls upstream with; a general-purpose HTTP library spends more time per request than the servers do
(benchmarks/gateway.py compares httpx, aiohttp and this client). This one writes each request in
one buffer, parses only the status line and headers, and hands the body over whole
(:meth:`HttpResponse.read`) or chunk by chunk as it arrives (:meth:`HttpResponse.chunks`, for
server-sent events); a body of known length is read with the head. TLS for ``https`` origins. A
connection goes back to the pool once its body is read to the end; :meth:`HttpResponse.abort`
closes it instead, which cancels the call upstream.

Every failure is an :class:`OSError`: the socket's own (connection refused, reset, no such host)
or a :class:`TransportError` when the response is cut short, malformed or late.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import NoReturn
from urllib.parse import urlsplit

__all__ = ["HttpClient", "HttpResponse", "Origin", "TransportError", "split_url"]

Origin = tuple[str, str, int]
"""``(scheme, host, port)``: where a connection goes, and the key of the pool."""

_LIMIT = 2**26  # the longest header block or chunk-size line accepted


class TransportError(OSError):
    """No complete HTTP response: closed early, malformed, or not within the timeout.

    ``sent`` tells whether the request had gone out: a timeout with ``sent`` False is a connection
    that could not be made (safe to send elsewhere), with ``sent`` True a server that took the
    request and has not answered (it may still be working on it).
    """

    def __init__(self, message: str, *, timed_out: bool = False, sent: bool = True) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.sent = sent


def split_url(url: str) -> tuple[Origin, str]:
    """The origin of an ``http(s)://HOST[:PORT][/PATH]`` URL and its path without a trailing slash.

    Raises ValueError for any other URL.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s)://HOST[:PORT] URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.scheme, parts.hostname, port), parts.path.rstrip("/")


class _Connection:
    __slots__ = ("origin", "reader", "writer")

    def __init__(self, origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.origin = origin
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class HttpResponse:
    """Status, headers (names in lower case) and a body to read once, whole or in chunks."""

    __slots__ = ("_body", "_client", "_connection", "_keep_alive", "_timeout_seconds", "headers", "status")

    def __init__(
        self,
        client: HttpClient,
        connection: _Connection,
        status: int,
        headers: dict[str, str],
        *,
        keep_alive: bool,
        timeout_seconds: float,
        body: bytes | None,
    ) -> None:
        self.status = status
        self.headers = headers
        self._client = client
        self._connection: _Connection | None = connection
        self._keep_alive = keep_alive
        self._timeout_seconds = timeout_seconds
        self._body = body
        if body is not None:
            self._release()

    async def read(self) -> bytes:
        """The whole body; the connection then returns to the pool. Raises OSError."""
        if self._body is not None:
            return self._body
        connection = self._connection
        if connection is None:
            return b""
        reader = connection.reader
        try:
            async with asyncio.timeout(self._timeout_seconds):
                if "chunked" in self.headers.get("transfer-encoding", ""):
                    body = b"".join([chunk async for chunk in _chunked(reader, self._timeout_seconds)])
                elif self.status in (204, 304) or self.status < 200:
                    body = b""
                else:
                    body = await reader.read()
                    self._keep_alive = False
        except BaseException as error:
            self.abort()
            _raise_failure(error, self._timeout_seconds)
        self._release()
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, each chunk within the timeout; the connection returns to the pool
        after the last one. Raises OSError."""
        connection = self._connection
        if connection is None:
            return
        if "chunked" not in self.headers.get("transfer-encoding", ""):
            yield await self.read()
            return
        try:
            async for chunk in _chunked(connection.reader, self._timeout_seconds):
                yield chunk
        except BaseException as error:
            self.abort()
            _raise_failure(error, self._timeout_seconds)
        self._release()

    def abort(self) -> None:
        """Close the connection without reading further (cancels the call upstream)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            if self._keep_alive:
                self._client.release(connection)
            else:
                connection.close()


class HttpClient:
    """Keep-alive HTTP/1.1 connections, pooled per origin; belongs to the event loop it is used on."""

    def __init__(
        self,
        *,
        connect_timeout_seconds: float = 10.0,
        read_timeout_seconds: float = 600.0,
        max_idle_per_origin: int = 256,
    ) -> None:
        self.connect_timeout_seconds = connect_timeout_seconds
        self.read_timeout_seconds = read_timeout_seconds
        self._max_idle = max_idle_per_origin
        self._idle: dict[Origin, list[_Connection]] = {}
        self._host_headers: dict[Origin, str] = {}
        self._ssl: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def request(
        self,
        method: str,
        origin: Origin,
        target: str,
        headers: str,
        body: bytes = b"",
        *,
        timeout_seconds: float | None = None,
    ) -> HttpResponse:
        """Send one request and read the response's head; ``headers`` are ``Name: value\\r\\n`` lines.

        ``timeout_seconds`` (default ``read_timeout_seconds``) bounds the wait for the head, then for
        the body (or for each chunk). A pooled connection that the server closed while idle is
        replaced once, transparently. Raises OSError.
        """
        timeout = self.read_timeout_seconds if timeout_seconds is None else timeout_seconds
        host = self._host_headers.get(origin) or self._host_header(origin)
        payload = (
            f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
        ).encode("latin-1") + body
        connection = self._take_idle(origin)
        if connection is not None:
            try:
                return await self._exchange(connection, payload, timeout)
            except OSError as error:
                if isinstance(error, TransportError) and error.timed_out:
                    raise
                # The server may have closed the idle connection; one try on a fresh one is safe.
        return await self._exchange(await self._connect(origin), payload, timeout)

    async def _exchange(
        self, connection: _Connection, payload: bytes, timeout_seconds: float
    ) -> HttpResponse:
        try:
            connection.writer.write(payload)
            async with asyncio.timeout(timeout_seconds):
                head = await connection.reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                version, status = lines[0].split(" ", 2)[:2]
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                # A body of known length is read with the head: one wait, and the connection is free.
                length = headers.get("content-length")
                body = None if length is None else await connection.reader.readexactly(int(length))
        except BaseException as error:
            connection.close()
            _raise_failure(error, timeout_seconds)
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        return HttpResponse(
            self,
            connection,
            int(status),
            headers,
            keep_alive=keep_alive,
            timeout_seconds=timeout_seconds,
            body=body,
        )

    def _take_idle(self, origin: Origin) -> _Connection | None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._idle.clear()  # connections of an earlier event loop cannot be used on this one
            self._loop = loop
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        context = self._ssl_context() if scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout_seconds):
                reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=_LIMIT)
        except TimeoutError:
            raise TransportError(
                f"could not connect within {self.connect_timeout_seconds:g} s", timed_out=True, sent=False
            ) from None
        return _Connection(origin, reader, writer)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _host_header(self, origin: Origin) -> str:
        scheme, host, port = origin
        name = f"[{host}]" if ":" in host else host
        default_port = (scheme, port) in (("http", 80), ("https", 443))
        self._host_headers[origin] = value = name if default_port else f"{name}:{port}"
        return value

    def release(self, connection: _Connection) -> None:
        """Return a connection whose response was read to the end to the pool."""
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) < self._max_idle:
            idle.append(connection)
        else:
            connection.close()

    async def close(self) -> None:
        """Close every pooled connection."""
        idle = [c for connections in self._idle.values() for c in connections]
        self._idle.clear()
        if asyncio.get_running_loop() is not self._loop:
            return  # they belong to an event loop that is gone
        for connection in idle:
            connection.close()
            with contextlib.suppress(Exception):
                await connection.writer.wait_closed()


async def _chunked(reader: asyncio.StreamReader, timeout_seconds: float) -> AsyncIterator[bytes]:
    """The chunks of a chunked body, each within ``timeout_seconds``."""
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


def _raise_failure(error: BaseException, timeout_seconds: float) -> NoReturn:
    """Raise what a failed exchange raises: ``error`` itself when it is an OSError or not a failure
    of the response (cancellation), else a TransportError."""
    if isinstance(error, TimeoutError):
        raise TransportError(f"no response within {timeout_seconds:g} s", timed_out=True) from error
    if isinstance(error, asyncio.IncompleteReadError):
        raise TransportError("the server closed the connection before a complete response") from error
    if isinstance(error, asyncio.LimitOverrunError | ValueError | IndexError):
        raise TransportError(f"malformed response: {error}") from error
    raise error
