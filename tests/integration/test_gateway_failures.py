"""Upstream failures the agent must see and the record must not hide: streams and bodies that
break off, error chunks, hung engines, and token ids that disagree with the usage."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import httpx
import openai
import pytest
from gateway_support import JsonDict, RawUpstream, gateway_env, sse_event, write_json, write_stream

from fulgor.gateway import GatewayConfig, Upstream
from fulgor.testing import ScriptedOpenAIServer

CHAT: Any = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chunk(delta: JsonDict, ids: list[int] | None = None, finish: str | None = None, **top: Any) -> bytes:
    choice: JsonDict = {"index": 0, "delta": delta, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
        choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.5} for _ in ids]}
    return sse_event({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice], **top})


async def read_openai_stream(client: openai.AsyncOpenAI, seen: list[Any]) -> None:
    async for part in await client.chat.completions.create(stream=True, **CHAT):
        seen.append(part)


async def read_anthropic_stream(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(model="m", max_tokens=5, messages=CHAT["messages"]) as stream:
        async for _ in stream:
            pass


OPENING = chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3])


async def cut_mid_stream(request: JsonDict, writer: asyncio.StreamWriter) -> None:
    await write_stream(
        writer, [OPENING, chunk({"content": "x"}, [10]), chunk({"content": "y"}, [11])], cut=True
    )


async def test_a_stream_cut_short_upstream_raises_in_the_openai_sdk_and_is_recorded_as_an_error() -> None:
    async with RawUpstream(cut_mid_stream) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        seen: list[Any] = []
        with pytest.raises(openai.APIError, match="broke off"):
            await read_openai_stream(client, seen)
        assert [part.choices[0].delta.content for part in seen] == ["", "x", "y"]
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "broke off" in call.error
        assert call.response_token_ids is None


async def test_a_stream_cut_short_upstream_raises_in_the_anthropic_sdk() -> None:
    async with RawUpstream(cut_mid_stream) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError, match="broke off"):
            await read_anthropic_stream(client)
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "broke off" in call.error


async def test_a_whole_answer_cut_after_its_head_is_a_502() -> None:
    async def cut_body(request: JsonDict, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            b'10\r\n{"id": "c", "cho\r\n'
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    async with RawUpstream(cut_body) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient() as http:
            reply = await http.post(f"{base_url}/chat/completions", json=CHAT)
        assert reply.status_code == 502
        assert reply.json()["error"]["code"] == "upstream_unavailable"
        assert "broke off" in reply.json()["error"]["message"]
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "broke off" in call.error


async def test_a_hung_engine_is_not_retried_after_the_request_was_sent() -> None:
    released = asyncio.Event()

    async def hang(request: JsonDict, writer: asyncio.StreamWriter) -> None:
        await released.wait()

    config = GatewayConfig(read_timeout_seconds=0.3, max_retries=3, retry_backoff_seconds=0.01)
    async with RawUpstream(hang) as upstream, gateway_env([upstream.url], config) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient(timeout=10) as http:
            reply = await http.post(f"{base_url}/chat/completions", json=CHAT)
        released.set()
        assert reply.status_code == 504
        assert reply.json()["error"]["code"] == "upstream_timeout"
        assert len(upstream.requests) == 1
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "not retried" in call.error


async def held_back_ids(request: JsonDict, writer: asyncio.StreamWriter) -> None:
    """vLLM before PR #29074: a tool parser held back a delta and dropped its id and logprob."""
    events = [
        OPENING,
        chunk({"content": "a"}, [10]),
        chunk({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": "{}"}}]}, [12]),
        chunk({}, [], "tool_calls"),
    ]
    if (request.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        events.append(sse_event({"id": "c", "model": "m", "choices": [], "usage": usage}))
    await write_stream(writer, [*events, b"data: [DONE]\n\n"])


async def test_streamed_ids_that_disagree_with_the_usage_are_flagged_and_the_agent_sees_no_usage() -> None:
    async with RawUpstream(held_back_ids) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
        parts = [part async for part in await client.chat.completions.create(stream=True, **CHAT)]
        assert len(parts) == 4
        assert all(part.usage is None and part.choices for part in parts)
        assert upstream.requests[0]["stream_options"] == {"include_usage": True}
        [call] = await env.calls(rollout, 1)
        assert call.token_ids_missing
        assert call.response_token_ids is None
        assert env.gateway.state()["recorder"]["token_ids_missing"] == 1


async def test_the_usage_chunk_reaches_only_agents_that_asked_for_it() -> None:
    async with ScriptedOpenAIServer() as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient() as http:
            silent = {**CHAT, "stream": True, "stream_options": {"continuous_usage_stats": True}}
            raw = (await http.post(f"{base_url}/chat/completions", json=silent)).content
        assert b'"usage"' not in raw
        assert raw.endswith(b"data: [DONE]\n\n")
        assert upstream.requests[0]["stream_options"] == {"include_usage": True}
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
        stream = await client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **CHAT
        )
        parts = [part async for part in stream]
        assert parts[-1].usage is not None
        assert parts[-1].usage.completion_tokens == 2
        calls = await env.calls(rollout, 2)
        assert not any(call.token_ids_missing for call in calls)
        assert [call.response_token_ids for call in calls] == [[111, 107]] * 2


async def test_an_upstream_not_asked_for_ids_gets_the_agents_request_unchanged() -> None:
    """``request_token_ids=False`` is for APIs that reject fields they do not know: fulgor adds
    neither its id request nor a usage request to what the agent sent."""
    async with ScriptedOpenAIServer() as upstream:
        replica = Upstream(upstream.url, request_token_ids=False)
        async with gateway_env([replica]) as env:
            _, base_url = await env.rollout()
            async with httpx.AsyncClient() as http:
                await http.post(f"{base_url}/chat/completions", json={**CHAT, "stream": True})
    assert upstream.requests[0] == {**CHAT, "stream": True}


async def test_an_upstream_error_chunk_reaches_the_openai_agent_and_is_recorded() -> None:
    async def fail_mid_stream(request: JsonDict, writer: asyncio.StreamWriter) -> None:
        error = {"message": "generation failed inside the engine", "type": "server_error", "code": "engine"}
        events = [OPENING, chunk({"content": "x"}, [10]), sse_event({"error": error}), b"data: [DONE]\n\n"]
        await write_stream(writer, events)

    async with RawUpstream(fail_mid_stream) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIError, match="generation failed"):
            await read_openai_stream(client, [])
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "generation failed" in call.error
        assert call.response == {}


async def test_an_event_that_is_not_a_json_object_is_passed_on_and_recorded_as_an_error() -> None:
    async def answer(request: JsonDict, writer: asyncio.StreamWriter) -> None:
        await write_stream(
            writer, [OPENING, chunk({"content": "x"}, [10]), b"data: [1, 2]\n\n", b"data: [DONE]\n\n"]
        )

    async with RawUpstream(answer) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        seen: list[Any] = []
        # Chat completions pass through as the upstream sent them; the recorder keeps the call.
        await read_openai_stream(openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0), seen)
        assert seen[-1] == [1, 2]
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "not a JSON object: [1, 2]" in call.error
        assert env.gateway.recorder.writer.stats.lost == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_answer_of_the_wrong_shape_is_passed_on_and_recorded_as_an_error(stream: bool) -> None:
    async def answer(request: JsonDict, writer: asyncio.StreamWriter) -> None:
        if stream:
            await write_stream(writer, [OPENING, b'data: {"choices": [1]}\n\n', b"data: [DONE]\n\n"])
        else:
            await write_json(writer, {"choices": [1]})

    async with RawUpstream(answer) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{base_url}/chat/completions", json={**CHAT, "stream": stream})
        assert response.status_code == 200  # passed on as the upstream sent it
        assert '{"choices": [1]}' in response.text
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "not a chat completion" in call.error
        assert call.response_token_ids is None
        assert env.gateway.recorder.writer.stats.lost == 0


async def test_a_call_the_gateway_fails_to_relay_is_recorded_as_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever breaks while relaying (here a fault injected into the stream relay), the agent did
    not get a whole answer, so the call must not be recorded as one with its token ids."""
    from fulgor.gateway import proxy

    def broken_finish(self: object) -> bytes:
        raise RuntimeError("relay fault")

    monkeypatch.setattr(proxy._OpenAIRelay, "finish", broken_finish)

    async def answer(request: JsonDict, writer: asyncio.StreamWriter) -> None:
        events = [OPENING, chunk({"content": "x"}, [10], finish="stop"), b"data: [DONE]\n\n"]
        await write_stream(writer, events)

    async with RawUpstream(answer) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        with pytest.raises(httpx.HTTPError):
            async with httpx.AsyncClient() as http:
                await http.post(f"{base_url}/chat/completions", json={**CHAT, "stream": True})
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "relay fault" in call.error
        assert call.response_token_ids is None
