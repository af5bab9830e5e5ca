"""The server's routing table: literal paths before templates, encoded slashes, 404/405, auth, mounts."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import pytest

from fulgor.errors import NotFoundError
from fulgor.server.http import Answer, Receive, Scope, Send
from fulgor.server.routing import Mount, Route, Router


def endpoint(name: str) -> Any:
    async def answer(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        return Answer(200, json.dumps({"route": name, "params": params}).encode())

    return answer


async def call(app: Any, method: str, raw_path: str, headers: list[tuple[bytes, bytes]] | None = None) -> Any:
    scope = {
        "type": "http",
        "method": method,
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "query_string": b"",
        "headers": headers or [],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    headers_out = dict(sent[0]["headers"])
    return sent[0]["status"], json.loads(sent[1]["body"]), headers_out


ROUTES = [
    Route("POST", "/rollouts/start", endpoint("start")),
    Route("GET", "/rollouts/{rollout_id}", endpoint("get")),
    Route("GET", "/rollouts/{rollout_id}/attempts/{attempt_id}", endpoint("attempt")),
    Route("GET", "/healthz", endpoint("health"), open=True),
]


async def test_a_literal_path_wins_over_a_template_and_other_methods_are_405() -> None:
    router = Router(ROUTES, token=None, max_body_bytes=100)
    assert (await call(router, "POST", "/rollouts/start"))[1]["route"] == "start"
    status, body, headers = await call(router, "GET", "/rollouts/start")
    assert (status, body["error"]["code"], headers[b"allow"]) == (405, "method_not_allowed", b"POST")
    status, body, _ = await call(router, "GET", "/rollouts/ro-1")
    assert (status, body["params"]) == (200, {"rollout_id": "ro-1"})


async def test_an_encoded_slash_stays_inside_its_parameter() -> None:
    router = Router(ROUTES, token=None, max_body_bytes=100)
    _, body, _ = await call(router, "GET", "/rollouts/a%2Fb/attempts/c%2fd")
    assert body["params"] == {"rollout_id": "a/b", "attempt_id": "c/d"}
    _, body, _ = await call(router, "GET", "/rollouts/")
    assert body["params"] == {"rollout_id": ""}  # an empty id is the store's to refuse


async def test_unknown_paths_are_404_and_need_the_token_like_any_route() -> None:
    router = Router(ROUTES, token="tok", max_body_bytes=100)
    status, body, _ = await call(router, "GET", "/nothing")
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    status, body, _ = await call(router, "GET", "/nothing", [(b"authorization", b"Bearer tok")])
    assert (status, body["error"]["code"]) == (404, "route_not_found")
    assert "/openapi.json" in body["error"]["message"]
    status, body, _ = await call(router, "GET", "/healthz")  # open: no token needed
    assert (status, body["route"]) == (200, "health")
    status, _, headers = await call(router, "POST", "/healthz")
    assert (status, headers[b"allow"]) == (405, b"GET")


async def test_a_declared_body_over_the_limit_is_413_before_the_route_runs() -> None:
    router = Router(ROUTES, token=None, max_body_bytes=100)
    status, body, _ = await call(router, "POST", "/rollouts/start", [(b"content-length", b"101")])
    assert (status, body["error"]["code"]) == (413, "payload_too_large")
    status, body, _ = await call(router, "POST", "/rollouts/start", [(b"content-length", b"ten")])
    assert (status, body["error"]["code"]) == (400, "bad_request")


async def test_errors_become_answers_and_a_crash_is_a_logged_500(caplog: pytest.LogCaptureFixture) -> None:
    async def missing(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        raise NotFoundError("rollout 'x' not found")

    async def crash(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        raise RuntimeError("the disk is on fire")

    router = Router(
        [Route("GET", "/missing", missing), Route("GET", "/crash", crash)], token=None, max_body_bytes=100
    )
    status, body, _ = await call(router, "GET", "/missing")
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body, _ = await call(router, "GET", "/crash")
    assert (status, body["error"]["code"]) == (500, "internal_error")
    assert "the disk is on fire" in caplog.text


async def test_a_mount_gets_its_requests_unchanged_and_does_its_own_checks() -> None:
    seen: list[str] = []

    async def gateway(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["path"])
        await Answer(200, b"{}").send(send)

    router = Router(ROUTES, [Mount("/r/", gateway)], token="tok", max_body_bytes=1)
    status, _, _ = await call(router, "POST", "/r/ro-1/at-1/v1/chat/completions", [(b"content-length", b"9")])
    assert (status, seen) == (200, ["/r/ro-1/at-1/v1/chat/completions"])


def test_two_routes_for_one_method_and_path_are_refused() -> None:
    with pytest.raises(ValueError, match="two routes for GET /healthz"):
        Router([*ROUTES, Route("GET", "/healthz", endpoint("again"))], token=None, max_body_bytes=1)
