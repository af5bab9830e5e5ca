"""Agent history normalised at the gateway for a vLLM engine whose template cannot render tool calls
or tool results, as fulgor's engine normalises it before rendering: a simulated vLLM on loopback
records the messages it receives, and the call is recorded as the agent sent it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from tests.integration.gateway_support import RawUpstream, gateway_env, write_json

from fulgor.engine.chat_format import ChatFormat
from fulgor.gateway import GatewayConfig, Upstream

ARGUMENTS = '{"expression": "2+3"}'
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": ARGUMENTS}}
# What the openai SDK sends back after a tool call: the assistant's turn with no content, two results.
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 2 + 3, twice?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    {"role": "tool", "tool_call_id": "call_2", "content": "5"},
]
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "10"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
}


def chat_format(*, renders_tool_calls: bool, knows_tool_role: bool) -> ChatFormat:
    """A Hermes-style template's format, as probing one that renders what is said would find it."""
    return ChatFormat("{{ messages }}", "hermes", None, True, renders_tool_calls, knows_tool_role)


async def simulated_vllm(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    await write_json(writer, COMPLETION)


async def received_messages(upstream: Upstream | None, raw: RawUpstream) -> list[dict[str, Any]]:
    """The messages the simulated vLLM got for one chat call of ``HISTORY`` through the gateway,
    after checking that the gateway recorded the agent's own."""
    config = GatewayConfig(retry_backoff_seconds=0.01)
    async with gateway_env([upstream or raw.url], config) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"{base_url}/chat/completions", json={"model": "m", "messages": HISTORY})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "10"
        [call] = await env.calls(rollout, 1)
        assert call.request["messages"] == HISTORY
    messages: list[dict[str, Any]] = raw.requests[-1]["messages"]
    return messages


async def test_a_template_without_tool_calls_or_a_tool_role_gets_them_as_text() -> None:
    async with RawUpstream(simulated_vllm) as raw:
        history = chat_format(renders_tool_calls=False, knows_tool_role=False)
        messages = await received_messages(Upstream(raw.url, history_format=history), raw)
    written = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    assert messages == [
        HISTORY[0],
        {"role": "assistant", "content": f"{written}\n{written}"},
        {
            "role": "user",
            "content": "<tool_response>\n5\n</tool_response>\n<tool_response>\n5\n</tool_response>",
        },
    ]


async def test_calls_the_template_renders_keep_their_arguments_as_the_agent_sent_them() -> None:
    async with RawUpstream(simulated_vllm) as raw:
        history = chat_format(renders_tool_calls=True, knows_tool_role=False)
        messages = await received_messages(Upstream(raw.url, history_format=history), raw)
    assert messages[1] == {**HISTORY[1], "content": ""}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
    assert [message["role"] for message in messages] == ["user", "assistant", "user"]


async def test_an_upstream_without_a_history_format_gets_the_messages_as_sent() -> None:
    async with RawUpstream(simulated_vllm) as raw:
        assert await received_messages(None, raw) == HISTORY


async def test_a_tool_call_without_a_name_is_refused_before_it_goes_upstream() -> None:
    broken = [HISTORY[0], {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]}]
    async with RawUpstream(simulated_vllm) as raw:
        history = chat_format(renders_tool_calls=False, knows_tool_role=False)
        async with gateway_env([Upstream(raw.url, history_format=history)]) as env:
            _, base_url = await env.rollout()
            async with httpx.AsyncClient() as http:
                answer = await http.post(
                    f"{base_url}/chat/completions", json={"model": "m", "messages": broken}
                )
        assert answer.status_code == 400
        assert "function.name" in answer.json()["error"]["message"]
        assert raw.requests == []
