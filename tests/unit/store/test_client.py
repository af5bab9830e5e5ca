"""StoreClient against a real server: retries without duplicates, long-poll without busy polling,
the sync facade and ``open_store`` URLs."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from storetools import request, span

from fulgor.server import BackgroundServer, ServerConfig, create_app
from fulgor.store import SyncStore, open_store
from fulgor.store.client import StoreClient, StoreUnreachableError
from fulgor.store.sqlite import SqliteStore


@dataclass
class Faults:
    """Which requests the flaky middleware answers with 503 after the app has handled them."""

    fail_first: dict[str, int] = field(default_factory=dict)  # path suffix -> how many to fail
    seen: list[str] = field(default_factory=list)


class FlakyMiddleware:
    """Runs the request, then replaces the answer by a 503: the work is done, the reply is lost."""

    def __init__(self, app: ASGIApp, faults: Faults) -> None:
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        self.faults.seen.append(path)
        suffix = next((s for s in self.faults.fail_first if path.endswith(s)), None)
        if suffix is None or self.faults.fail_first[suffix] <= 0:
            await self.app(scope, receive, send)
            return
        self.faults.fail_first[suffix] -= 1

        async def swallow(message: Message) -> None:
            pass

        await self.app(scope, receive, swallow)
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"busy"})


@pytest.fixture
async def flaky(tmp_path: Path) -> AsyncIterator[tuple[StoreClient, Faults]]:
    faults = Faults()
    app = create_app(ServerConfig(store=SqliteStore(tmp_path / "s.sqlite"), max_wait_seconds=0.25))
    app.add_middleware(FlakyMiddleware, faults=faults)
    server = BackgroundServer(app)
    await asyncio.to_thread(server.start)
    client = StoreClient(server.url, backoff_max_seconds=0.05)
    yield client, faults
    await client.close()
    await server.astop()


async def test_retried_writes_do_not_duplicate(flaky: tuple[StoreClient, Faults]) -> None:
    client, faults = flaky
    faults.fail_first.update({"/rollouts": 2, "/claim": 1, "/spans": 2})
    created = await client.enqueue([request({"n": 1})])
    (claimed,) = await client.claim("w1")
    stored = await client.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id, span_id="s1")])

    assert [r.rollout_id for r in await client.query_rollouts()] == [created[0].rollout_id]
    assert claimed.rollout_id == created[0].rollout_id
    attempts = await client.list_attempts(claimed.rollout_id)
    assert [a.attempt_id for a in attempts] == [claimed.attempt.attempt_id]
    assert await client.query_spans(claimed.rollout_id) == stored
    assert faults.seen.count("/api/v1/rollouts") == 3 + 1


async def test_retried_update_answers_like_the_first_try(flaky: tuple[StoreClient, Faults]) -> None:
    client, faults = flaky
    await client.enqueue([request()])
    (claimed,) = await client.claim("w1")
    faults.fail_first[claimed.attempt.attempt_id] = 1
    updated = await client.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    assert updated.status == "succeeded"
    assert (await client.get_rollout(claimed.rollout_id)).status == "succeeded"


async def test_retries_are_bounded(flaky: tuple[StoreClient, Faults]) -> None:
    client, faults = flaky
    faults.fail_first["/stats"] = 100
    with pytest.raises(StoreUnreachableError) as raised:
        await client.stats()
    assert "HTTP 503" in raised.value.message
    assert faults.seen.count("/api/v1/stats") == client.max_retries + 1


async def test_long_poll_does_not_busy_poll(flaky: tuple[StoreClient, Faults]) -> None:
    client, faults = flaky
    started = time.monotonic()
    assert await client.claim("w1", wait_seconds=1.0) == []
    assert await client.wait([(await client.enqueue([request()]))[0].rollout_id], timeout_seconds=1.0) == []
    assert time.monotonic() - started >= 2.0
    # The server holds each request up to its 0.25 s cap: about four requests per second of waiting.
    assert faults.seen.count("/api/v1/rollouts/claim") <= 6
    assert faults.seen.count("/api/v1/rollouts/wait") <= 6


async def test_client_rides_out_a_server_that_starts_late(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = StoreClient(f"http://127.0.0.1:{port}", backoff_max_seconds=0.2)
    server = BackgroundServer(create_app(ServerConfig(store=SqliteStore(tmp_path / "s.sqlite"))), port=port)

    async def start_later() -> None:
        await asyncio.sleep(0.4)
        await asyncio.to_thread(server.start)

    try:
        created, _ = await asyncio.gather(client.enqueue([request()]), start_later())
        assert [r.rollout_id for r in await client.query_rollouts()] == [created[0].rollout_id]
    finally:
        await client.close()
        await server.astop()


async def test_unreachable_server_says_what_to_check() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = StoreClient(f"http://127.0.0.1:{port}", max_retries=1, backoff_max_seconds=0.01)
    with pytest.raises(StoreUnreachableError) as raised:
        await client.stats()
    assert "fulgor serve" in raised.value.message
    assert str(port) in raised.value.message


def test_sync_facade_and_open_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = BackgroundServer(
        create_app(ServerConfig(store=SqliteStore(tmp_path / "s.sqlite"), token="tok")), port=0
    )
    server.start()
    monkeypatch.setenv("FULGOR_TOKEN", "tok")
    try:
        client = open_store(server.url)
        assert isinstance(client, StoreClient)
        with SyncStore(client) as store:
            (rollout,) = store.enqueue([request()])
            (claimed,) = store.claim("w1", wait_seconds=1)
            store.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id)])
            store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
            assert [r.status for r in store.wait([rollout.rollout_id], timeout_seconds=5)] == ["succeeded"]
            assert store.stats().spans == 1
    finally:
        server.stop()


class PeerMiddleware:
    """Notes the client address (host, port) of every request: one port is one TCP connection."""

    def __init__(self, app: ASGIApp, peers: list[tuple[str, int]]) -> None:
        self.app = app
        self.peers = peers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.peers.append(scope["client"])
        await self.app(scope, receive, send)


async def test_the_client_keeps_one_connection_alive_across_calls(tmp_path: Path) -> None:
    peers: list[tuple[str, int]] = []
    app = create_app(ServerConfig(store=SqliteStore(tmp_path / "s.sqlite")))
    app.add_middleware(PeerMiddleware, peers=peers)
    server = BackgroundServer(app)
    await asyncio.to_thread(server.start)
    client = StoreClient(server.url)
    try:
        (created,) = await client.enqueue([request()])
        (claimed,) = await client.claim("w1")
        await client.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id)])
        await client.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
        await client.wait([created.rollout_id], timeout_seconds=5)
        await client.stats()
    finally:
        await client.close()
        await server.astop()
    assert len(peers) == 6
    assert len(set(peers)) == 1, f"a new connection per call: {peers}"
