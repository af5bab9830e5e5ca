"""The lean HTTP client: keep-alive reuse, chunked bodies, stale pooled connections, transport errors."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from fulgor.gateway.config import Upstream
from fulgor.net.http_client import HttpClient, TransportError, split_url
from fulgor.testing import ScriptedOpenAIServer

HEADERS = "Content-Type: application/json\r\n"


def key_and_path(url: str) -> tuple[tuple[str, str, int], str]:
    upstream = Upstream(url)
    return (upstream.scheme, upstream.host, upstream.port), upstream.base_path


async def test_requests_reuse_one_connection() -> None:
    async with ScriptedOpenAIServer() as server:
        key, path = key_and_path(server.url)
        client = HttpClient()
        for _ in range(3):
            response = await client.request("GET", key, f"{path}/models", HEADERS)
            assert response.status == 200
            assert json.loads(await response.read())["data"][0]["id"] == "scripted-model"
        assert len(client._idle[key]) == 1
        await client.close()


async def test_a_chunked_stream_arrives_in_pieces_and_ends() -> None:
    async with ScriptedOpenAIServer() as server:
        key, path = key_and_path(server.url)
        client = HttpClient()
        body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True}).encode()
        response = await client.request("POST", key, f"{path}/chat/completions", HEADERS, body)
        chunks = [chunk async for chunk in response.chunks()]
        assert len(chunks) > 2
        assert chunks[-1].endswith(b"data: [DONE]\n\n")
        await client.close()


async def test_a_connection_the_server_closed_is_replaced() -> None:
    # The server answers once, then closes that connection when the next request arrives on it (as
    # a server closing an idle keep-alive connection just as the client reuses it): the client must
    # send the request again on a new connection.
    accepted: list[int] = []
    reused: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted) + 1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        if len(accepted) == 1:
            reused.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    origin = ("http", "127.0.0.1", server.sockets[0].getsockname()[1])
    client = HttpClient()
    try:
        assert await (await client.request("GET", origin, "/first", "")).read() == b"ok"
        assert len(client._idle[origin]) == 1  # the pooled connection the server will close

        response = await client.request("GET", origin, "/second", "")

        assert (response.status, await response.read()) == (200, b"ok")
        assert reused[0].startswith(b"GET /second ")  # it went out on the pooled connection first
        assert accepted == [1, 2]  # and again on a fresh one
    finally:
        await client.close()
        server.close()


async def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    server = ScriptedOpenAIServer()
    await server.start()
    port = server.port
    key, path = key_and_path(server.url)
    client = HttpClient()
    await (await client.request("GET", key, f"{path}/models", HEADERS)).read()
    await server.close()
    restarted = ScriptedOpenAIServer(port=port)
    await restarted.start()
    try:
        response = await client.request("GET", key, f"{path}/models", HEADERS)
        assert response.status == 200
        await response.read()
    finally:
        await client.close()
        await restarted.close()


async def test_connection_refused_raises() -> None:
    client = HttpClient(connect_timeout_seconds=1)
    with pytest.raises(ConnectionRefusedError):
        await client.request("GET", ("http", "127.0.0.1", 1), "/v1/models", HEADERS)


async def test_a_whole_body_and_a_reply_too_slow_is_a_timed_out_transport_error() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    client = HttpClient()
    try:
        with pytest.raises(TransportError) as raised:
            await client.request(
                "GET", ("http", "127.0.0.1", server.sockets[0].getsockname()[1]), "/", "", timeout_seconds=0.2
            )
        assert raised.value.timed_out
        assert raised.value.sent  # the server took the request: it may still be working on it
        assert isinstance(raised.value, OSError)
    finally:
        server.close()
        await client.close()


async def test_a_connection_not_made_in_time_is_a_timed_out_transport_error_before_sending() -> None:
    """A listener whose accept queue is full leaves new connections hanging: nothing was sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    try:
        for _ in range(4):  # more than the queue holds; later SYNs go unanswered
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(address)
            fillers.append(filler)
        client = HttpClient(connect_timeout_seconds=0.3)
        with pytest.raises(TransportError) as raised:
            await client.request("GET", ("http", *address), "/", "")
        assert raised.value.timed_out
        assert not raised.value.sent
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_response_cut_short_is_a_transport_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nshort\r\n")
        writer.close()

    server = await asyncio.start_server(cut, "127.0.0.1", 0)
    client = HttpClient()
    origin = ("http", "127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        response = await client.request("GET", origin, "/", "")
        assert response.status == 200
        with pytest.raises(TransportError, match="closed the connection"):
            await response.read()
    finally:
        server.close()
        await client.close()


def test_split_url() -> None:
    assert split_url("https://api.example.com/v1/") == (("https", "api.example.com", 443), "/v1")
    assert split_url("http://127.0.0.1:8474") == (("http", "127.0.0.1", 8474), "")
    with pytest.raises(ValueError, match="not an http"):
        split_url("ftp://example.com")
