"""The scripted OpenAI server answers as OpenAI and vLLM do: finish reasons, stream ids, usage, errors."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from fulgor.net.http_client import HttpClient, split_url
from fulgor.testing import ScriptedOpenAIServer, ScriptedReply

HEADERS = "Content-Type: application/json\r\n"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def post(server: ScriptedOpenAIServer, path: str, body: bytes | dict[str, Any]) -> tuple[int, bytes]:
    """Status and body of one request (a dict is sent as JSON, bytes as they are)."""
    origin, base = split_url(server.url)
    client = HttpClient(read_timeout_seconds=5)
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        response = await client.request("POST", origin, f"{base}{path}", HEADERS, payload)
        return response.status, await response.read()
    finally:
        await client.close()


async def events(server: ScriptedOpenAIServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of a streamed answer."""
    status, data = await post(server, path, {**body, "stream": True})
    assert status == 200
    return [json.loads(event[6:]) for event in data.split(b"\n\n") if event.startswith(b"data: {")]


async def test_a_text_completion_finishes_as_scripted() -> None:
    length = ScriptedReply(text="abc", finish_reason="length")
    async with ScriptedOpenAIServer([length, ScriptedReply(text="ab"), length]) as server:
        status, data = await post(server, "/completions", {"prompt": "x", "n": 2})
        assert status == 200
        assert [c["finish_reason"] for c in json.loads(data)["choices"]] == ["length", "stop"]
        chunks = await events(server, "/completions", {"prompt": "x"})
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


async def test_every_chunk_of_a_stream_carries_the_responses_one_id_and_created() -> None:
    async with ScriptedOpenAIServer() as server:
        usage = {"stream_options": {"include_usage": True}}
        chat = await events(server, "/chat/completions", {**CHAT, "n": 2, **usage})
        completion = await events(server, "/completions", {"prompt": ["x", "y"]})
    for chunks in (chat, completion):
        assert len(chunks) > 4
        assert len({(chunk["id"], chunk["created"]) for chunk in chunks}) == 1, chunks
    assert chat[0]["id"] != completion[0]["id"]


async def test_completion_usage_counts_each_prompt_once_however_many_choices() -> None:
    async with ScriptedOpenAIServer() as server:
        _, data = await post(server, "/completions", {"prompt": "hello", "n": 3})
        assert json.loads(data)["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
        _, data = await post(server, "/completions", {"prompt": ["ab", "cde"], "n": 2})
        assert json.loads(data)["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object, not list")],
)
async def test_a_malformed_body_is_answered_400_in_openais_shape(body: bytes, message: str) -> None:
    async with ScriptedOpenAIServer() as server:
        status, data = await post(server, "/chat/completions", body)
        assert server.requests == []
    assert status == 400
    error = json.loads(data)["error"]
    assert message in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, None)


async def test_route_and_scripted_errors_carry_openais_type_param_and_code() -> None:
    async with ScriptedOpenAIServer() as server:
        status, data = await post(server, "/embeddings", {"input": "x"})
        assert status == 404
        assert json.loads(data)["error"] == {
            "message": "no route POST /v1/embeddings; this server serves GET /v1/models, "
            "POST /v1/chat/completions and POST /v1/completions",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        server.fail_next(status=429)
        server.fail_next(status=503)
        rate_limited = await post(server, "/chat/completions", CHAT)
        unavailable = await post(server, "/chat/completions", CHAT)
    assert rate_limited[0] == 429
    assert json.loads(rate_limited[1])["error"] == {
        "message": "scripted failure",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert unavailable[0] == 503
    assert json.loads(unavailable[1])["error"]["type"] == "server_error"


def test_with_on_a_taken_port_raises_at_once() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(OSError, match="address already in use"), ScriptedOpenAIServer(port=port):
        pass
    assert time.monotonic() - started < 5  # raised at once, not after the 10 s start timeout
    taken.close()
    with ScriptedOpenAIServer(port=port) as server:
        assert server.port == port
