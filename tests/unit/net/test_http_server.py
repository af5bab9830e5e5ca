"""The minimal HTTP/1.1 server: keep-alive, chunked replies, 100-continue, body limits, bad requests."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import pytest

from fulgor.net.http_server import HttpReply, HttpRequest, error_reply, serve_http


async def echo(request: HttpRequest) -> HttpReply:
    if request.path == "/stream":

        async def chunks() -> AsyncIterator[bytes]:
            for part in (b"one ", b"two"):
                yield part

        return HttpReply(stream=chunks(), content_type="text/plain")
    if request.path == "/missing":
        return error_reply(404, "not_found", "nothing here")
    return HttpReply(body=json.dumps({"method": request.method, "body": request.body.decode()}).encode())


async def exchange(raw: bytes, *, max_body_bytes: int | None = None) -> bytes:
    """Everything a fresh server answers to ``raw`` before it closes the connection."""
    server = await serve_http(echo, "127.0.0.1", 0, max_body_bytes=max_body_bytes)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(raw)
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return data
    finally:
        server.close()


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    request = b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi"
    last = b"GET /missing HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    data = await exchange(request + request + last)
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert b'{"method": "POST", "body": "hi"}' in data
    assert b"HTTP/1.1 404 Not Found" in data
    assert b'"code": "not_found"' in data


async def test_a_stream_is_sent_chunked() -> None:
    data = await exchange(b"GET /stream HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert b"transfer-encoding: chunked" in data
    assert data.endswith(b"4\r\none \r\n3\r\ntwo\r\n0\r\n\r\n")


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    server = await serve_http(echo, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    writer.write(
        b"POST /x HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    )
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hi")
    assert b"HTTP/1.1 200 OK" in await asyncio.wait_for(reader.read(), 5)
    writer.close()
    server.close()


async def test_a_body_over_the_limit_is_413_without_reading_it() -> None:
    data = await exchange(b"POST /x HTTP/1.1\r\nContent-Length: 11\r\n\r\n", max_body_bytes=10)
    assert data.startswith(b"HTTP/1.1 413 Content Too Large")
    assert b"connection: close" in data
    assert b"at most 10 bytes" in data


async def test_a_malformed_request_is_400() -> None:
    data = await exchange(b"NONSENSE\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400 Bad Request")
    assert b'"code": "bad_request"' in data


def test_a_connection_open_when_the_loop_shuts_down_ends_quietly(caplog: pytest.LogCaptureFixture) -> None:
    # asyncio.run cancels every task left when its main coroutine returns, the server's connection
    # tasks too; a cancelled one must not be reported as "Exception in callback".
    async def main() -> None:
        server = await serve_http(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\n")  # half a request: its task waits for the rest
        await writer.drain()
        await asyncio.sleep(0.1)
        server.close()

    caplog.set_level(logging.DEBUG, logger="asyncio")
    asyncio.run(main())

    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR], caplog.text


async def read_reply(reader: asyncio.StreamReader) -> bytes:
    """One reply with a Content-Length body, head and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await asyncio.wait_for(reader.readexactly(length), 5)


async def test_close_closes_an_idle_keep_alive_connection() -> None:
    # From Python 3.12 asyncio's wait_closed() waits for every connection: a client keeping one open
    # would hold up the server's close for ever.
    server = await serve_http(echo, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    writer.write(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
    assert (await read_reply(reader)).startswith(b"HTTP/1.1 200 OK")
    server.close()
    await asyncio.wait_for(server.wait_closed(), 2)
    assert await asyncio.wait_for(reader.read(), 2) == b""  # the server closed it
    writer.close()


async def test_close_lets_a_request_in_progress_finish_as_the_connections_last() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request: HttpRequest) -> HttpReply:
        entered.set()
        await release.wait()
        return HttpReply(body=b"done")

    server = await serve_http(slow, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    writer.write(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
    await asyncio.wait_for(entered.wait(), 5)
    server.close()
    release.set()
    reply = await read_reply(reader)
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert b"connection: close" in reply
    assert reply.endswith(b"done")
    assert await asyncio.wait_for(reader.read(), 2) == b""
    await asyncio.wait_for(server.wait_closed(), 2)
    writer.close()
