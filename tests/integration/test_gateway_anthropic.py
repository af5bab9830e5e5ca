"""The Anthropic SDK (streamed and not, tool use included) and curl through the gateway; stop
sequences, upstream errors mid-stream and error shapes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anthropic
import pytest
from gateway_support import (
    BROKEN_STREAM_ENDS,
    GatewayEnv,
    RawUpstream,
    assert_matches,
    gateway_env,
    sse_event,
    write_json,
    write_stream,
)

from fulgor.gateway import GatewayConfig
from fulgor.testing import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall

CURL_SCRIPT = Path(__file__).with_name("gateway_curl.sh")
TOOLS: Any = [
    {"name": "add", "description": "Add numbers.", "input_schema": {"type": "object", "properties": {}}}
]


def anthropic_base(base_url: str) -> str:
    return base_url.removesuffix("/v1")


async def test_messages_with_tool_use_round_trip(env: GatewayEnv, upstream: ScriptedOpenAIServer) -> None:
    upstream.script(ScriptedReply(text="Let me add.", tool_calls=(ScriptedToolCall("add", {"a": 1}),)))
    upstream.script(ScriptedReply(text="It is 1."))
    rollout, base_url = await env.rollout()

    def conversation() -> tuple[anthropic.types.Message, anthropic.types.Message]:
        client = anthropic.Anthropic(base_url=anthropic_base(base_url), api_key="unused")
        messages: Any = [{"role": "user", "content": "add 1"}]
        first = client.messages.create(
            model="m",
            max_tokens=64,
            system="You add.",
            messages=messages,
            tools=TOOLS,
        )
        tool_use = next(block for block in first.content if block.type == "tool_use")
        messages.append({"role": "assistant", "content": first.content})
        result = {"type": "tool_result", "tool_use_id": tool_use.id, "content": "1"}
        messages.append({"role": "user", "content": [result]})
        second = client.messages.create(model="m", max_tokens=64, messages=messages, tools=TOOLS)
        return first, second

    first, second = await asyncio.to_thread(conversation)
    assert first.stop_reason == "tool_use"
    assert [block.type for block in first.content] == ["text", "tool_use"]
    assert first.content[1].input == {"a": 1}  # type: ignore[union-attr]
    assert second.content[0].text == "It is 1."  # type: ignore[union-attr]
    assert second.stop_reason == "end_turn"
    sent = upstream.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "add"
    assert sent[2]["tool_call_id"] == first.content[1].id  # type: ignore[union-attr]
    recorded = await env.calls(rollout, 2)
    for call, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(call, sample)


async def test_messages_streaming_text_and_tool_use(env: GatewayEnv, upstream: ScriptedOpenAIServer) -> None:
    upstream.script(ScriptedReply(text="Hi there"))
    upstream.script(ScriptedReply(text="", tool_calls=(ScriptedToolCall("add", {"a": 2, "b": 2}),)))
    rollout, base_url = await env.rollout()
    client = anthropic.AsyncAnthropic(base_url=anthropic_base(base_url), api_key="unused")

    async with client.messages.stream(
        model="m", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    ) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Hi there"
    assert final.stop_reason == "end_turn"

    async with client.messages.stream(
        model="m",
        max_tokens=64,
        messages=[{"role": "user", "content": "2+2"}],
        tools=TOOLS,
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use"
    assert final.content[0].input == {"a": 2, "b": 2}
    recorded = await env.calls(rollout, 2)
    for call, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(call, sample)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
async def test_curl_from_a_shell_script(env: GatewayEnv, upstream: ScriptedOpenAIServer) -> None:
    upstream.script(ScriptedReply(text="whole"), ScriptedReply(text="streamed"))
    rollout, base_url = await env.rollout()
    result = await asyncio.to_thread(
        subprocess.run,
        ["bash", str(CURL_SCRIPT)],
        env={**os.environ, "OPENAI_BASE_URL": base_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    whole, *stream_lines = result.stdout.strip().splitlines()
    assert json.loads(whole)["choices"][0]["message"]["content"] == "whole"
    assert stream_lines[-1] == "data: [DONE]"
    recorded = await env.calls(rollout, 2)
    for call, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(call, sample)


def chat_chunk(choice: dict[str, Any], **top: Any) -> bytes:
    return sse_event({"id": "c", "model": "m", "choices": [{"index": 0, **choice}], **top})


async def stop_on_end(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    """vLLM's answer when a stop string matched: finish_reason "stop", stop_reason the string."""
    ids = {"prompt_token_ids": [1, 2]}
    if not request.get("stream"):
        choice = {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}
        body = {"id": "c", "model": "m", "choices": [{**choice, "token_ids": [97], "stop_reason": "END"}]}
        await write_json(writer, {**body, **ids, "usage": {"prompt_tokens": 2, "completion_tokens": 1}})
        return
    events = [
        chat_chunk({"delta": {"role": "assistant", "content": ""}}, **ids),
        chat_chunk({"delta": {"content": "a"}, "token_ids": [97]}),
        chat_chunk({"delta": {}, "token_ids": [], "finish_reason": "stop", "stop_reason": "END"}),
        sse_event({"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}),
        b"data: [DONE]\n\n",
    ]
    await write_stream(writer, events)


async def test_a_matched_stop_sequence_is_reported_whole_and_streamed() -> None:
    async with RawUpstream(stop_on_end) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = anthropic.AsyncAnthropic(base_url=anthropic_base(base_url), api_key="unused")
        request: Any = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        whole = await client.messages.create(**request, stop_sequences=["END"])
        assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", "END")
        async with client.messages.stream(**request, stop_sequences=["END"]) as stream:
            streamed = await stream.get_final_message()
        assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "END")
        assert [sent["stop"] for sent in upstream.requests] == [["END"], ["END"]]
        calls = await env.calls(rollout, 2)
        assert [call.response_token_ids for call in calls] == [[97], [97]]


async def test_an_upstream_error_chunk_ends_the_stream_with_an_error_event() -> None:
    async def fail_mid_stream(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        error = {"message": "generation failed inside the engine", "type": "server_error", "code": "engine"}
        events = [
            chat_chunk({"delta": {"role": "assistant", "content": ""}}, prompt_token_ids=[1]),
            chat_chunk({"delta": {"content": "Hel"}, "token_ids": [72]}),
            sse_event({"error": error}),
            b"data: [DONE]\n\n",
        ]
        await write_stream(writer, events)

    async with RawUpstream(fail_mid_stream) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = anthropic.AsyncAnthropic(base_url=anthropic_base(base_url), api_key="unused", max_retries=0)
        with pytest.raises(anthropic.APIStatusError, match="generation failed"):
            await read_stream(client)
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "generation failed" in call.error
        assert call.response_token_ids is None


@pytest.mark.parametrize("payload", [[1], {"choices": [1]}, {"choices": [{"message": 5}]}])
async def test_a_whole_answer_that_is_not_a_chat_completion_is_a_502(payload: Any) -> None:
    async def answer(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        await write_json(writer, payload)

    async with RawUpstream(answer) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = anthropic.AsyncAnthropic(base_url=anthropic_base(base_url), api_key="unused", max_retries=0)
        with pytest.raises(anthropic.InternalServerError, match="not a chat completion") as raised:
            await client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert raised.value.status_code == 502
        [call] = await env.calls(rollout, 1)  # recorded, never trained on
        assert call.response_token_ids is None
        assert call.error is not None


@pytest.mark.parametrize(("rest", "match"), BROKEN_STREAM_ENDS)
async def test_a_stream_cut_short_or_malformed_upstream_ends_with_an_error_event(
    rest: list[bytes], match: str
) -> None:
    async def answer(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        opening = chat_chunk({"delta": {"role": "assistant", "content": ""}}, prompt_token_ids=[1])
        await write_stream(
            writer, [opening, chat_chunk({"delta": {"content": "Hel"}, "token_ids": [72]}), *rest]
        )

    async with RawUpstream(answer) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = anthropic.AsyncAnthropic(base_url=anthropic_base(base_url), api_key="unused", max_retries=0)
        with pytest.raises(anthropic.APIStatusError, match=match):
            await read_stream(client)
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert re.search(match, call.error)
        assert call.response_token_ids is None


async def read_stream(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        async for _ in stream:
            pass


async def test_errors_reach_the_sdk_in_anthropics_shape(upstream: ScriptedOpenAIServer) -> None:
    async with gateway_env([upstream.url], GatewayConfig(api_key="s3cret")) as env:
        rollout, base_url = await env.rollout()
        client = anthropic.AsyncAnthropic(base_url=anthropic_base(base_url), api_key="s3cret", max_retries=0)
        request: Any = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(anthropic.BadRequestError, match="messages must be a list of JSON objects") as bad:
            await client.messages.create(**{**request, "messages": ["hi"]})
        assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        upstream.fail_next(1, status=400)
        with pytest.raises(anthropic.BadRequestError, match="scripted failure") as refused:
            await client.messages.create(**request)
        assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        wrong_key = client.with_options(api_key="wrong")
        with pytest.raises(anthropic.PermissionDeniedError) as denied:
            await wrong_key.messages.create(**request)
        assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
        await env.calls(rollout, 1)
    assert len(upstream.requests) == 1
