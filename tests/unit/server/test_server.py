"""The store server's HTTP surface: error bodies, auth, size limits, idempotency, long-poll, spec."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.unit.store.servetools import ServedStore, serve_sqlite
from tests.unit.store.storetools import FakeClock, request, span

from fulgor.errors import ConfigError, InvalidTransitionError, NotFoundError, StoreUnavailableError
from fulgor.net.sockets import bind_socket
from fulgor.server import BackgroundServer, ServerConfig, check_bind, create_app
from fulgor.server.draining import Draining
from fulgor.store.client import StoreClient, StoreServerError
from fulgor.store.memory import MemoryStore

TOKEN = "s3cret-token"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[ServedStore]:
    store = await serve_sqlite(tmp_path / "store.sqlite", FakeClock(), max_body_bytes=4096)
    yield store
    await store.close()


@pytest.fixture
async def http(served: ServedStore) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url) as client:
        yield client


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert {"code", "message"} <= set(body["error"])
    error: dict[str, Any] = body["error"]
    return error


async def test_healthz_and_openapi_need_no_token(tmp_path: Path) -> None:
    served = await serve_sqlite(tmp_path / "s.sqlite", FakeClock(), token=TOKEN)
    try:
        async with httpx.AsyncClient(base_url=served.url) as http:
            health = await http.get("/healthz")
            spec = (await http.get("/openapi.json")).json()
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert spec["paths"]["/api/v1/spans"]["post"]["security"] == [{"bearer": []}]
        assert "/v1/traces" in spec["paths"]
    finally:
        await served.close()


async def test_spec_lists_every_store_operation(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()
    operations = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    store_methods = {
        "enqueue", "start_rollout", "claim", "get_rollout", "query_rollouts", "cancel", "start_attempt",
        "update_attempt", "list_attempts", "add_spans", "query_spans", "put_resources", "get_resources",
        "heartbeat", "list_workers", "wait", "stats",
    }  # fmt: skip
    assert store_methods <= operations


async def test_missing_token_is_401_and_wrong_token_403(tmp_path: Path) -> None:
    served = await serve_sqlite(tmp_path / "s.sqlite", FakeClock(), token=TOKEN)
    try:
        async with httpx.AsyncClient(base_url=served.url) as http:
            missing = await http.get("/api/v1/stats")
            wrong = await http.get("/api/v1/stats", headers={"Authorization": "Bearer nope"})
            right = await http.get("/api/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        assert (missing.status_code, error_of(missing)["code"]) == (401, "unauthorized")
        assert missing.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in error_of(missing)["message"]
        assert (wrong.status_code, error_of(wrong)["code"]) == (403, "forbidden")
        assert right.status_code == 200
        assert (await served.stats()).spans == 0  # the client sends its token
        with pytest.raises(StoreServerError) as raised:
            await ServedStore(served.server, token="nope").stats()
        assert (raised.value.status, raised.value.code) == (403, "forbidden")
    finally:
        await served.close()


def test_non_loopback_without_token_is_refused_with_the_remedy() -> None:
    for host in ("127.0.0.1", "localhost", "::1"):
        check_bind(host, None)
    check_bind("0.0.0.0", TOKEN)
    with pytest.raises(ConfigError) as raised:
        check_bind("0.0.0.0", None)
    assert "--token-file" in raised.value.message
    assert "FULGOR_TOKEN" in raised.value.message


def test_port_in_use_names_the_port_and_the_remedy() -> None:
    taken = bind_socket("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as raised:
            bind_socket("127.0.0.1", port)
        assert f"port {port}" in raised.value.message
        assert "--port 0" in raised.value.message
    finally:
        taken.close()


async def test_store_errors_map_to_status_codes_with_error_bodies(
    http: httpx.AsyncClient, served: ServedStore
) -> None:
    missing = await http.get("/api/v1/rollouts/ro-missing")
    assert (missing.status_code, error_of(missing)["code"]) == (404, "not_found")

    (rollout,) = await served.enqueue([request()])
    (claimed,) = await served.claim("w1")
    await served.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    path = f"/api/v1/rollouts/{rollout.rollout_id}/attempts/{claimed.attempt.attempt_id}"
    again = await http.patch(path, json={"status": "failed"})
    assert (again.status_code, error_of(again)["code"]) == (409, "invalid_transition")
    assert error_of(again)["details"]["from_status"] == "succeeded"
    with pytest.raises(InvalidTransitionError) as raised:
        await served.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="failed")
    assert (raised.value.from_status, raised.value.to_status) == ("succeeded", "failed")

    bad_page = await http.get("/api/v1/rollouts", params={"limit": "-1"})
    assert bad_page.status_code == 400
    assert "limit" in error_of(bad_page)["message"]

    unknown_route = await http.get("/api/v1/nothing-here")
    assert (unknown_route.status_code, error_of(unknown_route)["code"]) == (404, "route_not_found")
    with pytest.raises(NotFoundError):
        await served.get_rollout("ro/with/slashes")


async def test_validation_errors_name_the_field_path(http: httpx.AsyncClient) -> None:
    bad_span = {"spans": [{"rollout_id": "r", "attempt_id": "a", "trace_id": "t", "span_id": "s"}]}
    response = await http.post("/api/v1/spans", json=bad_span)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "validation_error"
    assert "spans[0].name" in error["message"]
    assert "spans[0].start_time" in error["message"]

    not_json = await http.post(
        "/api/v1/rollouts", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert (not_json.status_code, error_of(not_json)["code"]) == (400, "validation_error")

    extra = await http.post("/api/v1/rollouts/claim", json={"worker_id": "w", "surprise": 1})
    assert "surprise" in error_of(extra)["message"]


async def test_bodies_over_the_limit_are_413(http: httpx.AsyncClient) -> None:
    big = {"requests": [{"input": "x" * 5000}]}
    announced = await http.post("/api/v1/rollouts", json=big)
    assert (announced.status_code, error_of(announced)["code"]) == (413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 1000

    streamed = await http.post("/api/v1/rollouts", content=chunks())
    assert (streamed.status_code, error_of(streamed)["code"]) == (413, "payload_too_large")
    assert (await http.get("/api/v1/stats")).json()["rollouts"] == {}


async def test_a_retried_write_with_the_same_key_runs_once(http: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "k-1"}
    body = {"requests": [{"input": 1}]}
    first = await http.post("/api/v1/rollouts", json=body, headers=headers)
    second = await http.post("/api/v1/rollouts", json=body, headers=headers)
    other = await http.post("/api/v1/rollouts", json=body, headers={"Idempotency-Key": "k-2"})
    assert first.status_code == 200
    assert second.content == first.content
    assert other.json()[0]["rollout_id"] != first.json()[0]["rollout_id"]
    assert len((await http.get("/api/v1/rollouts")).json()) == 2


async def test_a_retried_claim_gets_the_same_rollout(http: httpx.AsyncClient, served: ServedStore) -> None:
    await served.enqueue([request({"n": 1}), request({"n": 2})])
    headers = {"Idempotency-Key": "claim-1"}
    first = await http.post("/api/v1/rollouts/claim", json={"worker_id": "w"}, headers=headers)
    retried = await http.post("/api/v1/rollouts/claim", json={"worker_id": "w"}, headers=headers)
    assert retried.json() == first.json()
    assert len(await served.query_rollouts(status="queuing")) == 1


async def test_a_retry_arriving_during_the_first_request_waits_for_its_answer(
    http: httpx.AsyncClient, served: ServedStore
) -> None:
    headers = {"Idempotency-Key": "claim-wait"}
    body = {"worker_id": "w", "wait_seconds": 5}
    first = asyncio.ensure_future(http.post("/api/v1/rollouts/claim", json=body, headers=headers))
    await asyncio.sleep(0.2)
    second = asyncio.ensure_future(http.post("/api/v1/rollouts/claim", json=body, headers=headers))
    await asyncio.sleep(0.2)
    await served.enqueue([request()])
    one, two = await asyncio.gather(first, second)
    assert len(one.json()) == 1
    assert two.json() == one.json()


async def test_long_polls_are_capped_and_the_client_loops(tmp_path: Path) -> None:
    served = await serve_sqlite(tmp_path / "s.sqlite", time.time, max_wait_seconds=0.2)
    try:
        started = time.monotonic()
        assert await served.claim("w", wait_seconds=0.7) == []
        assert 0.6 < time.monotonic() - started < 5

        async def enqueue_later() -> None:
            await asyncio.sleep(0.5)
            await served.enqueue([request()])

        claimed, _ = await asyncio.gather(served.claim("w", wait_seconds=10), enqueue_later())
        assert len(claimed) == 1
    finally:
        await served.close()


async def test_stopping_the_server_answers_held_long_polls_at_once(tmp_path: Path) -> None:
    server = BackgroundServer(create_app(ServerConfig(store=MemoryStore())))
    await asyncio.to_thread(server.start)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        held = asyncio.ensure_future(
            http.post("/api/v1/rollouts/claim", json={"worker_id": "w", "wait_seconds": 25})
        )
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await server.astop()
        response = await held
    assert response.json() == []
    assert time.monotonic() - started < 5


class _BrokenStats(MemoryStore):
    async def stats(self) -> Any:
        raise RuntimeError("the disk is on fire")


async def test_an_unexpected_failure_is_a_logged_500_and_the_server_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = BackgroundServer(create_app(ServerConfig(store=_BrokenStats())))
    await asyncio.to_thread(server.start)
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            failed = await http.get("/api/v1/stats")
            workers = await http.get("/api/v1/workers")
    finally:
        await server.astop()
    assert failed.status_code == 500
    assert error_of(failed)["code"] == "internal_error"
    assert "the disk is on fire" not in failed.text
    assert "the disk is on fire" in caplog.text
    assert workers.status_code == 200


async def test_middleware_added_to_the_app_sees_store_requests_too() -> None:
    seen: list[str] = []

    class Record:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])
            await self.app(scope, receive, send)

    app = create_app(ServerConfig(store=MemoryStore()))
    app.add_middleware(Record)
    server = BackgroundServer(app)
    await asyncio.to_thread(server.start)
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/api/v1/stats")).status_code == 200
            assert (await http.get("/healthz")).status_code == 200
    finally:
        await server.astop()
    assert seen == ["/api/v1/stats", "/healthz"]


async def _call_asgi(app: Any, path: str, messages: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """Send ``messages`` as the request of a POST to ``path``; the answer's status and JSON body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    incoming = iter(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(incoming, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def test_a_body_in_parts_is_read_whole_and_a_client_gone_midway_changes_nothing() -> None:
    store = MemoryStore()
    app = create_app(ServerConfig(store=store))
    body = json.dumps({"requests": [{"input": {"q": 1}}, {"input": {"q": 2}}]}).encode()
    status, enqueued = await _call_asgi(
        app,
        "/api/v1/rollouts",
        [
            {"type": "http.request", "body": body[:10], "more_body": True},
            {"type": "http.request", "body": body[10:], "more_body": False},
        ],
    )
    assert status == 200
    assert [rollout["input"] for rollout in enqueued] == [{"q": 1}, {"q": 2}]
    status, error = await _call_asgi(
        app, "/api/v1/rollouts", [{"type": "http.request", "body": body[:-2], "more_body": True}]
    )
    assert status == 400
    assert error["error"]["code"] == "request_incomplete"
    assert (await store.stats()).rollouts == {"queuing": 2}


async def test_spans_in_one_batch(tmp_path: Path) -> None:
    served = await serve_sqlite(tmp_path / "s.sqlite", time.time)
    try:
        await served.enqueue([request()])
        (claimed,) = await served.claim("w")
        batch = [span(claimed.rollout_id, claimed.attempt.attempt_id, name=f"s{i}") for i in range(500)]
        stored = await served.add_spans(batch)
        assert [s.sequence_id for s in stored] == list(range(1, 501))
        assert await served.add_spans(batch) == stored
        assert (await served.stats()).spans == 500
    finally:
        await served.close()


def test_spec_is_valid_json_with_component_refs() -> None:
    spec = create_app(ServerConfig(store=MemoryStore())).openapi()
    text = json.dumps(spec)
    refs = {part.split('"')[0] for part in text.split('"#/components/schemas/')[1:]}
    assert refs <= set(spec["components"]["schemas"])


async def test_a_claim_retried_on_another_server_leaves_an_orphan_the_watchdog_retries(
    tmp_path: Path,
) -> None:
    # Idempotency keys live in one server's memory: the same key on a second server (or a restarted
    # one) claims again. The worker heartbeats only the attempt it heard of; the orphan goes silent.
    clock = FakeClock()
    first = await serve_sqlite(tmp_path / "store.sqlite", clock)
    second = await serve_sqlite(tmp_path / "store.sqlite", clock)
    try:
        lost, kept = await first.enqueue(
            [request({"n": i}, unresponsive_seconds=10, max_attempts=2) for i in (0, 1)]
        )
        claim = {"worker_id": "w1"}
        headers = {"Idempotency-Key": "claim-lost"}
        async with httpx.AsyncClient() as http:
            (answered,) = (
                await http.post(f"{first.url}/api/v1/rollouts/claim", json=claim, headers=headers)
            ).json()
            (retried,) = (
                await http.post(f"{second.url}/api/v1/rollouts/claim", json=claim, headers=headers)
            ).json()
        assert (answered["rollout_id"], retried["rollout_id"]) == (lost.rollout_id, kept.rollout_id)

        for _ in range(3):
            clock.advance(6)
            await second.heartbeat("w1", attempt_ids=[retried["attempt"]["attempt_id"]])

        assert (await second.get_rollout(lost.rollout_id)).status == "requeuing"
        assert [a.status for a in await first.list_attempts(lost.rollout_id)] == ["unresponsive"]
        assert (await second.get_rollout(kept.rollout_id)).status == "preparing"
        (again,) = await second.claim("w2")
        assert (again.rollout_id, again.attempt.sequence_id) == (lost.rollout_id, 2)
    finally:
        await second.close()
        await first.close()


class _Outage(MemoryStore):
    """A store whose database is down for the first ``failures`` enqueues."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    async def enqueue(self, requests: Any) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise StoreUnavailableError("PostgreSQL at db:5432/fulgor failed: connection refused")
        return await super().enqueue(requests)


async def test_an_unavailable_store_is_a_503_that_is_not_remembered_and_the_client_retries() -> None:
    store = _Outage(failures=2)
    server = BackgroundServer(create_app(ServerConfig(store=store)))
    await asyncio.to_thread(server.start)
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            headers = {"Idempotency-Key": "enqueue-1"}
            body = {"requests": [{"input": 1}]}
            down = await http.post("/api/v1/rollouts", json=body, headers=headers)
            assert (down.status_code, error_of(down)["code"]) == (503, "store_unavailable")
            assert "connection refused" in error_of(down)["message"]
            client = StoreClient(server.url, backoff_max_seconds=0.01)
            (rollout,) = await client.enqueue([request()])  # 503 once more, then stored
            await client.close()
            back = await http.post("/api/v1/rollouts", json=body, headers=headers)
            assert back.status_code == 200
        assert store.calls == 4
        assert [r.rollout_id for r in await store.query_rollouts()] == [
            rollout.rollout_id,
            back.json()[0]["rollout_id"],
        ]
    finally:
        await server.astop()


async def test_a_client_that_keeps_getting_503_says_why() -> None:
    server = BackgroundServer(create_app(ServerConfig(store=_Outage(failures=100))))
    await asyncio.to_thread(server.start)
    client = StoreClient(server.url, max_retries=1, backoff_max_seconds=0.01)
    try:
        with pytest.raises(StoreUnavailableError, match="connection refused"):
            await client.enqueue([request()])
    finally:
        await client.close()
        await server.astop()


async def test_an_id_with_a_nul_character_is_a_400_on_every_route(http: httpx.AsyncClient) -> None:
    missing = await http.get("/api/v1/rollouts/ro-%00")
    beat = await http.post("/api/v1/workers/heartbeat", json={"worker_id": "w\u0000"})
    assert (missing.status_code, error_of(missing)["code"]) == (400, "validation_error")
    assert (beat.status_code, error_of(beat)["code"]) == (400, "validation_error")
    assert "NUL" in error_of(beat)["message"]


def test_draining_can_begin_while_a_held_request_registers() -> None:
    # A signal handler runs on the loop's thread, between any two steps of hold(): one landing while
    # hold() registers its waiter must neither deadlock nor be missed.
    draining = Draining()

    class SignalDuringAdd(set[Any]):
        def add(self, item: Any) -> None:
            super().add(item)
            draining.begin()

    draining._waiters = SignalDuringAdd()

    async def held() -> str:
        await asyncio.sleep(30)
        return "work"

    async def fallback() -> str:
        return "answered at once"

    results: list[str] = []
    thread = threading.Thread(target=lambda: results.append(asyncio.run(draining.hold(held(), fallback))))
    thread.daemon = True
    thread.start()
    thread.join(timeout=10)
    assert results == ["answered at once"]


def test_the_server_app_is_built_and_served_without_a_web_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fulgor.server import BackgroundServer, ServerConfig, create_app\n"
        "from fulgor.store.memory import MemoryStore\n"
        "with BackgroundServer(create_app(ServerConfig(store=MemoryStore()))) as server:\n"
        "    import urllib.request\n"
        "    assert urllib.request.urlopen(server.url + '/healthz').status == 200\n"
        "print(sorted(m for m in ('fastapi', 'starlette') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
