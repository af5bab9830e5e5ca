"""A small HTTP/1.1 client over asyncio streams with keep-alive connection reuse.

The store client sends many small requests; a general-purpose HTTP library spends more time per
request than the server does (REFERENCE.md: ~350 requests/s with httpx's async client against
~1,100 with keep-alive ``http.client``). This transport does only what the store API needs:
one request per connection at a time, ``Content-Length`` or chunked response bodies, TLS for
``https`` URLs, and a pool of idle connections. Every failure to get a complete response is a
:class:`TransportError`, which callers treat as transient.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from fulgor.errors import ConfigError

__all__ = ["ConnectionPool", "HttpResponse", "TransportError"]

_MAX_HEAD_BYTES = 64 * 1024


class TransportError(Exception):
    """No complete HTTP response: refused, reset, closed early, timed out or malformed."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    async def exchange(self, request: bytes) -> tuple[HttpResponse, bool]:
        """Send one request and read its response; returns it and whether to keep the connection."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, status_text = lines[0].split(" ", 2)[:2]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        status = int(status_text)
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._read_chunked()
        elif status in (204, 304) or status < 200:
            body = b""
        else:
            body = await self.reader.read()
            keep_alive = False
        return HttpResponse(status, headers, body), keep_alive

    async def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


class ConnectionPool:
    """Keep-alive connections to one ``http://`` or ``https://`` origin, reused across requests.

    Belongs to the event loop it is first used on.
    """

    def __init__(self, url: str, *, max_idle: int = 32) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"server URL {url!r} must look like http://HOST:PORT or https://HOST:PORT")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        default_port = (parts.scheme == "http" and self.port == 80) or (
            parts.scheme == "https" and self.port == 443
        )
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = host if default_port else f"{host}:{self.port}"
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._loop: asyncio.AbstractEventLoop | None = None

    async def request(
        self, method: str, target: str, headers: str, body: bytes | None, timeout_seconds: float
    ) -> HttpResponse:
        """One request; ``headers`` are extra ``Name: value\\r\\n`` lines. Raises TransportError."""
        content = body or b""
        head = (
            f"{method} {self.base_path}{target} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            f"Content-Length: {len(content)}\r\n{headers}\r\n"
        )
        request = head.encode("latin-1") + content
        connection = self._take_idle()
        if connection is not None:
            try:
                return await self._exchange(connection, request, timeout_seconds)
            except TransportError as error:
                if error.timed_out:
                    raise
                # The server may have closed the idle connection; one try on a fresh one is safe.
        return await self._exchange(await self._connect(timeout_seconds), request, timeout_seconds)

    async def _exchange(
        self, connection: _Connection, request: bytes, timeout_seconds: float
    ) -> HttpResponse:
        try:
            async with asyncio.timeout(timeout_seconds):
                response, keep_alive = await connection.exchange(request)
        except (
            OSError,
            EOFError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ) as error:
            connection.close()
            raise TransportError(_describe(error)) from error
        except TimeoutError:
            connection.close()
            raise TransportError(f"no response within {timeout_seconds:g} s", timed_out=True) from None
        except BaseException:
            connection.close()
            raise
        if keep_alive and len(self._idle) < self._max_idle:
            self._idle.append(connection)
        else:
            connection.close()
        return response

    def _take_idle(self) -> _Connection | None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._idle.clear()  # connections of an earlier event loop cannot be used on this one
            self._loop = loop
        while self._idle:
            connection = self._idle.pop()
            if connection.usable():
                return connection
            connection.close()
        return None

    async def _connect(self, timeout_seconds: float) -> _Connection:
        try:
            async with asyncio.timeout(timeout_seconds):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self._ssl, limit=_MAX_HEAD_BYTES
                )
        except OSError as error:
            raise TransportError(_describe(error)) from error
        except TimeoutError:
            raise TransportError(f"could not connect within {timeout_seconds:g} s", timed_out=True) from None
        return _Connection(reader, writer)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _describe(error: BaseException) -> str:
    if isinstance(error, asyncio.IncompleteReadError):
        return "the server closed the connection before a complete response"
    return str(error) or type(error).__name__
