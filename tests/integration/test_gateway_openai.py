"""The official OpenAI SDK (sync, async, streaming, tool calls) and LangChain through the gateway.

Each test asserts that the recorded token ids and logprobs equal what the upstream sampled. The
upstream is a fixture: the scripted OpenAI-compatible server here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
from gateway_support import GatewayEnv, assert_matches

from fulgor.testing import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]


async def test_sync_client_chat_is_recorded_with_the_sampled_ids(
    env: GatewayEnv, upstream: ScriptedOpenAIServer
) -> None:
    upstream.script(ScriptedReply(text="4"))
    rollout, base_url = await env.rollout()

    def call() -> str | None:
        client = openai.OpenAI(base_url=base_url, api_key="unused")
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "2+2?"}], temperature=0.5
        )
        return reply.choices[0].message.content

    assert await asyncio.to_thread(call) == "4"
    [recorded] = await env.calls(rollout, 1)
    assert_matches(recorded, upstream.samples[0])
    assert recorded.request["messages"] == [{"role": "user", "content": "2+2?"}]
    assert recorded.response["message"]["content"] == "4"
    assert recorded.engine_replica == upstream.url
    assert upstream.requests[0]["return_token_ids"] is True


async def test_async_client_keeps_its_own_view_and_the_record_gets_ids(
    env: GatewayEnv, upstream: ScriptedOpenAIServer
) -> None:
    rollout, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    for turn in range(3):
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"t{turn}"}]
        )
        assert reply.choices[0].message.content == "ok"
    recorded = await env.calls(rollout, 3)
    for call, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(call, sample)
        assert call.latency_seconds is not None


async def test_async_streaming_chat_records_the_streamed_ids(
    env: GatewayEnv, upstream: ScriptedOpenAIServer
) -> None:
    upstream.script(ScriptedReply(text="streamed answer"))
    rollout, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], stream=True
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == "streamed answer"
    [recorded] = await env.calls(rollout, 1)
    assert_matches(recorded, upstream.samples[0])
    assert recorded.response["message"]["content"] == "streamed answer"
    assert recorded.response["finish_reason"] == "stop"


async def test_tool_calls_reach_the_agent_and_their_ids_are_recorded(
    env: GatewayEnv, upstream: ScriptedOpenAIServer
) -> None:
    call = ScriptedToolCall("add", {"a": 2, "b": 3})
    upstream.script(ScriptedReply(text="", tool_calls=(call,)), ScriptedReply(text="5"))
    upstream.script(ScriptedReply(text="", tool_calls=(call,)))
    rollout, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    messages: Any = [{"role": "user", "content": "2+3?"}]
    first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    [tool_call] = first.choices[0].message.tool_calls or []
    assert tool_call.type == "function"
    assert tool_call.function.name == "add"
    assert json.loads(tool_call.function.arguments) == {"a": 2, "b": 3}
    assert first.choices[0].finish_reason == "tool_calls"
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": tool_call.id, "content": "5"}]
    second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "5"

    stream = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)
    names = [
        tc.function.name
        async for chunk in stream
        if chunk.choices
        for tc in chunk.choices[0].delta.tool_calls or []
        if tc.function is not None
    ]
    assert names == ["add"]
    recorded = await env.calls(rollout, 3)
    for recorded_call, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(recorded_call, sample)
    assert recorded[0].response["message"]["tool_calls"][0]["function"]["name"] == "add"
    assert recorded[2].response["message"]["tool_calls"][0]["function"]["name"] == "add"


async def test_text_completions_streamed_and_not(env: GatewayEnv, upstream: ScriptedOpenAIServer) -> None:
    upstream.script(ScriptedReply(text="abc"), ScriptedReply(text="xyz"))
    rollout, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    whole = await client.completions.create(model="m", prompt="say abc")
    assert whole.choices[0].text == "abc"
    stream = await client.completions.create(model="m", prompt="say xyz", stream=True)
    assert "".join([chunk.choices[0].text async for chunk in stream if chunk.choices]) == "xyz"
    recorded = await env.calls(rollout, 2)
    for call, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(call, sample)
    assert recorded[1].response["text"] == "xyz"


async def test_models_are_listed_from_the_upstream(env: GatewayEnv) -> None:
    _, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    models = await client.models.list()
    assert [model.id async for model in models] == ["scripted-model"]


async def test_langchain_chat_openai_is_recorded(env: GatewayEnv, upstream: ScriptedOpenAIServer) -> None:
    from langchain_openai import ChatOpenAI

    upstream.script(ScriptedReply(text="hello from langchain"))
    rollout, base_url = await env.rollout()

    def call() -> object:
        model = ChatOpenAI(base_url=base_url, api_key="unused", model="m")
        return model.invoke("hi").content

    assert await asyncio.to_thread(call) == "hello from langchain"
    [recorded] = await env.calls(rollout, 1)
    assert_matches(recorded, upstream.samples[0])
