"""The Anthropic SDK (streamed and not, tool use included) and curl through the gateway."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from gateway_support import GatewayEnv, assert_matches, gateway_env

from fulgor.testing import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall

CURL_SCRIPT = Path(__file__).with_name("gateway_curl.sh")
TOOLS: Any = [
    {"name": "add", "description": "Add numbers.", "input_schema": {"type": "object", "properties": {}}}
]


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedOpenAIServer]:
    async with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture
async def env(upstream: ScriptedOpenAIServer) -> AsyncIterator[GatewayEnv]:
    async with gateway_env([upstream.url]) as env:
        yield env


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
