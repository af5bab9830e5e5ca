"""The openai SDK's Responses API (streamed and not, function tools included) and the OpenAI Agents
SDK through the gateway: the recorded call is the translated chat request with the engine's ids;
refusals, upstream errors and length limits reach the SDK in OpenAI's shapes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import (
    BROKEN_STREAM_ENDS,
    GatewayEnv,
    RawUpstream,
    assert_matches,
    gateway_env,
    sse_event,
    wait_for_disconnect,
    write_json,
    write_stream,
)

from fulgor.gateway import GatewayConfig
from fulgor.testing import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall

TOOLS: Any = [
    {
        "type": "function",
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def client_for(base_url: str, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


async def test_a_function_tool_round_trip(env: GatewayEnv, upstream: ScriptedOpenAIServer) -> None:
    upstream.script(
        ScriptedReply(text="Let me add.", tool_calls=(ScriptedToolCall("add", {"a": 1, "b": 2}),))
    )
    upstream.script(ScriptedReply(text="It is 3."))
    rollout, base_url = await env.rollout()
    client = client_for(base_url)
    conversation: Any = [{"role": "user", "content": "add 1 and 2"}]

    first = await client.responses.create(model="m", instructions="You add.", input=conversation, tools=TOOLS)
    assert first.status == "completed"
    assert [item.type for item in first.output] == ["message", "function_call"]
    assert first.output_text == "Let me add."
    call = first.output[1]
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 1, "b": 2})

    # The conversation goes back whole, the model's output items as they came, then the tool's result.
    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": "3"})
    second = await client.responses.create(
        model="m", instructions="You add.", input=conversation, tools=TOOLS
    )
    assert second.output_text == "It is 3."
    assert second.usage is not None
    assert second.usage.output_tokens == len(upstream.samples[1].token_ids)

    sent = upstream.requests[1]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["messages"][2]["content"] == "Let me add."
    assert sent["messages"][2]["tool_calls"][0]["function"]["name"] == "add"
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": call.call_id, "content": "3"}
    assert sent["tools"][0]["function"]["name"] == "add"
    recorded = await env.calls(rollout, 2)
    for record, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(record, sample)
    # The recorded request is the chat request the engine got, not the Responses request.
    assert recorded[1].request["messages"][3]["role"] == "tool"


async def test_streamed_text_and_a_streamed_function_call(
    env: GatewayEnv, upstream: ScriptedOpenAIServer
) -> None:
    upstream.script(ScriptedReply(text="Hi there"))
    upstream.script(ScriptedReply(text="", tool_calls=(ScriptedToolCall("add", {"a": 2, "b": 2}),)))
    rollout, base_url = await env.rollout()
    client = client_for(base_url)

    stream = await client.responses.create(model="m", input="hello", stream=True)
    events = [event async for event in stream]
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == "Hi there"
    assert events[-1].response.output_text == "Hi there"

    async with client.responses.stream(model="m", input="2+2", tools=TOOLS) as helper:
        final = await helper.get_final_response()
    [call] = final.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 2, "b": 2})
    assert final.usage is not None
    assert final.usage.input_tokens == len(upstream.samples[1].prompt_token_ids)

    recorded = await env.calls(rollout, 2)
    for record, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(record, sample)
    assert all(request["stream"] for request in upstream.requests)


async def test_a_length_limit_makes_the_response_incomplete(
    env: GatewayEnv, upstream: ScriptedOpenAIServer
) -> None:
    upstream.script(ScriptedReply(text="Once upon", finish_reason="length"))
    upstream.script(ScriptedReply(text="Once upon", finish_reason="length"))
    rollout, base_url = await env.rollout()
    client = client_for(base_url)
    whole = await client.responses.create(model="m", input="a story", max_output_tokens=9)
    assert (whole.status, whole.incomplete_details and whole.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    stream = await client.responses.create(model="m", input="a story", max_output_tokens=9, stream=True)
    last = [event async for event in stream][-1]
    assert last.type == "response.incomplete"
    assert [request["max_tokens"] for request in upstream.requests] == [9, 9]
    # A length stop is a whole sample: its ids are kept for training.
    recorded = await env.calls(rollout, 2)
    for record, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(record, sample)


async def test_a_tool_call_cut_by_the_length_limit_is_incomplete(
    env: GatewayEnv, upstream: ScriptedOpenAIServer
) -> None:
    cut = ScriptedReply(
        text="Let me add.", tool_calls=(ScriptedToolCall("add", {"a": 1, "b": 2}),), finish_reason="length"
    )
    upstream.script(cut, cut)
    rollout, base_url = await env.rollout()
    client = client_for(base_url)
    whole = await client.responses.create(model="m", input="add", tools=TOOLS, max_output_tokens=30)
    assert whole.status == "incomplete"
    assert [(item.type, item.status) for item in whole.output] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
    ]
    stream = await client.responses.create(
        model="m", input="add", tools=TOOLS, max_output_tokens=30, stream=True
    )
    events = [event async for event in stream]
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [(item.type, item.status) for item in done] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
    ]
    assert events[-1].type == "response.incomplete"
    assert [item.status for item in events[-1].response.output] == ["completed", "incomplete"]
    recorded = await env.calls(rollout, 2)
    for record, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(record, sample)


async def test_an_agent_that_disconnects_mid_stream_cancels_the_upstream_call() -> None:
    async with (
        ScriptedOpenAIServer(
            default_reply=ScriptedReply(text="x" * 200), token_delay_seconds=0.02
        ) as upstream,
        gateway_env([upstream.url]) as env,
    ):
        rollout, base_url = await env.rollout()
        stream = await client_for(base_url).responses.create(model="m", input="hi", stream=True)
        seen = 0
        async for event in stream:
            seen += event.type == "response.output_text.delta"
            if seen == 5:
                break
        await stream.close()
        await wait_for_disconnect(upstream)
        assert upstream.disconnects == 1
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "disconnected" in call.error
        assert call.response_token_ids is None


async def test_refusals_and_errors_reach_the_sdk_in_openais_shape(upstream: ScriptedOpenAIServer) -> None:
    async with gateway_env([upstream.url], GatewayConfig(api_key="s3cret")) as env:
        rollout, base_url = await env.rollout()
        client = client_for(base_url, api_key="s3cret")
        with pytest.raises(openai.BadRequestError, match="send the full conversation as 'input'") as stateful:
            await client.responses.create(model="m", input="again", previous_response_id="resp_1")
        assert stateful.value.body["type"] == "invalid_request_error"  # type: ignore[index]
        assert stateful.value.code == "invalid_request"
        with pytest.raises(openai.BadRequestError, match="tools of type 'web_search' are not supported"):
            await client.responses.create(model="m", input="news", tools=[{"type": "web_search"}])
        image: Any = {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"}
        with pytest.raises(openai.BadRequestError, match="'input_image' are not supported"):
            await client.responses.create(model="m", input=[{"role": "user", "content": [image]}])
        with pytest.raises(openai.NotFoundError, match="the gateway stores no responses"):
            await client.responses.retrieve("resp_1")
        upstream.fail_next(1, status=400)
        with pytest.raises(openai.BadRequestError, match="upstream: scripted failure") as refused:
            await client.responses.create(model="m", input="hi")
        assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await client.with_options(api_key="wrong").responses.create(model="m", input="hi")
        assert denied.value.body["type"] == "permission_error"  # type: ignore[index]
        await env.calls(rollout, 1)
    assert len(upstream.requests) == 1


async def test_an_upstream_error_mid_stream_makes_the_sdk_raise() -> None:
    async def fail_mid_stream(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        error = {"message": "generation failed inside the engine", "type": "server_error", "code": "engine"}
        chunk = {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "Hel"}, "token_ids": [72]}],
        }
        events = [
            sse_event({**chunk, "prompt_token_ids": [1]}),
            sse_event({"error": error}),
            b"data: [DONE]\n\n",
        ]
        await write_stream(writer, events)

    async with RawUpstream(fail_mid_stream) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        client = client_for(base_url)
        with pytest.raises(openai.APIError, match="generation failed"):
            await read_stream(client)
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "generation failed" in call.error
        assert call.response_token_ids is None


HEL = sse_event(
    {
        "id": "c",
        "model": "m",
        "prompt_token_ids": [1],
        "choices": [{"index": 0, "delta": {"content": "Hel"}, "token_ids": [72]}],
    }
)


@pytest.mark.parametrize(("rest", "match"), BROKEN_STREAM_ENDS)
async def test_a_stream_cut_short_or_malformed_upstream_makes_the_sdk_raise(
    rest: list[bytes], match: str
) -> None:
    async def answer(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        await write_stream(writer, [HEL, *rest])

    async with RawUpstream(answer) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        with pytest.raises(openai.APIError, match=match):
            await read_stream(client_for(base_url))
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert re.search(match, call.error)
        assert call.response_token_ids is None


@pytest.mark.parametrize("payload", [[1], {"choices": [1]}, {"choices": [{"message": 5}]}])
async def test_a_whole_answer_that_is_not_a_chat_completion_is_a_502(payload: Any) -> None:
    async def answer(request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        await write_json(writer, payload)

    async with RawUpstream(answer) as upstream, gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        with pytest.raises(openai.InternalServerError, match="not a chat completion") as raised:
            await client_for(base_url).responses.create(model="m", input="hi")
        assert raised.value.status_code == 502
        [call] = await env.calls(rollout, 1)  # recorded, never trained on
        assert call.response_token_ids is None
        assert call.error is not None


async def read_stream(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(model="m", input="hi") as stream:
        async for _ in stream:
            pass


# An OpenAI Agents SDK program as its author wrote it: the default (Responses) model and a
# function tool. It runs as its own process, pointed at the gateway by the environment alone.
AGENTS_SDK_PROGRAM = """
import asyncio

from agents import Agent, Runner, function_tool


@function_tool
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b


async def main() -> None:
    agent = Agent(name="calc", instructions="Use the add tool.", tools=[add], model="m")
    result = await Runner.run(agent, "What is 19 + 23?")
    print(result.last_response_id)
    print(result.final_output)
    streamed = Runner.run_streamed(agent, "What is 19 + 23?")
    async for _ in streamed.stream_events():
        pass
    print(streamed.final_output)


asyncio.run(main())
"""


async def test_an_openai_agents_sdk_agent_runs_unchanged(
    env: GatewayEnv, upstream: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    for _ in range(2):  # once run whole, once streamed
        upstream.script(ScriptedReply(text="", tool_calls=(ScriptedToolCall("add", {"a": 19, "b": 23}),)))
        upstream.script(ScriptedReply(text="The sum is 42."))
    rollout, base_url = await env.rollout()
    program = tmp_path / "calc_agent.py"
    program.write_text(AGENTS_SDK_PROGRAM)
    # What a runner hands a zero-code agent; tracing off, as it would export to OpenAI's servers.
    agent_env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "unused"}
    agent_env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(program),
        cwd=tmp_path,
        env=agent_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()
    response_id, final_output, streamed_output = stdout.decode().strip().splitlines()
    assert final_output == streamed_output == "The sum is 42."
    assert response_id.startswith("resp_")  # the Responses API answered, not chat completions

    for sent in (upstream.requests[1], upstream.requests[3]):
        messages = sent["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
        assert messages[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 19, "b": 23}'}
        assert messages[3]["content"] == "42"
    assert [bool(sent.get("stream")) for sent in upstream.requests] == [False, False, True, True]
    recorded = await env.calls(rollout, 4)
    for record, sample in zip(recorded, upstream.samples, strict=True):
        assert_matches(record, sample)


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fulgor's local engine serving a tiny model on CPU."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fulgor.engine.app import create_app
    from fulgor.engine.local import EngineConfig, LocalEngine
    from fulgor.engine.models import init_model
    from fulgor.net.asgi import ServerThread

    model_dir = init_model(tmp_path_factory.mktemp("responses-engine") / "tiny", "tiny", seed=0)
    engine = LocalEngine.from_config(EngineConfig(model=model_dir, device="cpu", max_model_len=512, seed=0))
    with ServerThread(create_app(engine)) as server:
        yield f"{server.url}/v1"


async def test_the_local_engine_answers_and_its_own_ids_are_recorded(engine_url: str) -> None:
    async with gateway_env([engine_url]) as env:
        rollout, base_url = await env.rollout()
        client = client_for(base_url)
        request: Any = {"model": "tiny", "instructions": "Be kind.", "input": "Hello", "max_output_tokens": 8}
        whole = await client.responses.create(**request, temperature=0)
        stream = await client.responses.create(**request, temperature=0, stream=True)
        streamed = [event async for event in stream][-1].response
        calls = await env.calls(rollout, 2)
    # The engine answers the recorded chat request, greedily, with the very ids and text recorded.
    for call, response in zip(calls, (whole, streamed), strict=True):
        assert not call.token_ids_missing
        assert call.request["messages"] == [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Hello"},
        ]
        direct = {k: v for k, v in call.request.items() if k not in ("stream", "stream_options")}
        async with httpx.AsyncClient() as http:
            answer = (
                await http.post(f"{engine_url}/chat/completions", json={**direct, "return_token_ids": True})
            ).json()
        assert call.prompt_token_ids == answer["prompt_token_ids"]
        assert call.response_token_ids == answer["choices"][0]["token_ids"]
        assert response.output_text == (answer["choices"][0]["message"]["content"] or "")
        assert response.usage is not None
        assert response.usage.output_tokens == len(answer["choices"][0]["token_ids"])


@pytest.mark.parametrize(
    "text",
    [
        {"format": {"type": "json_object"}},
        {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
    ],
    ids=["json_object", "json_schema"],
)
async def test_a_json_text_format_is_refused_by_the_local_engine(engine_url: str, text: Any) -> None:
    async with gateway_env([engine_url]) as env:
        rollout, base_url = await env.rollout()
        with pytest.raises(openai.BadRequestError, match="response_format") as refused:
            await client_for(base_url).responses.create(model="tiny", input="Hello", text=text)
        assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
        [call] = await env.calls(rollout, 1)
    assert call.response_token_ids is None
