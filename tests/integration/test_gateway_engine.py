"""The gateway in front of fulgor's local engine (a tiny model on CPU), driven by the official SDKs.

The recorded ids must be the ones the engine sampled: equal to the ids the engine returned to the
client (OpenAI passes them through), and their recorded logprobs must match a forward pass of the
model over exactly those ids (which re-tokenised text would not).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import anthropic
import openai
from gateway_support import GatewayEnv, gateway_env
from tests.engine_support import assert_sampled_by

from fulgor.engine.app import create_app
from fulgor.engine.local import EngineConfig, LocalEngine
from fulgor.engine.models import init_model
from fulgor.gateway import GatewayConfig
from fulgor.net.asgi import ServerThread
from fulgor.types import LLM

MODEL = "tiny"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    model_dir = init_model(tmp_path_factory.mktemp("gateway-engine") / MODEL, "tiny", seed=0)
    return LocalEngine.from_config(EngineConfig(model=model_dir, device="cpu", max_model_len=512, seed=0))


@pytest.fixture(scope="module")
def engine_url(engine: LocalEngine) -> Iterator[str]:
    with ServerThread(create_app(engine)) as server:
        yield f"{server.url}/v1"


@pytest.fixture
async def env(engine_url: str) -> AsyncIterator[GatewayEnv]:
    async with gateway_env([engine_url]) as env:
        yield env


async def test_openai_chat_records_the_ids_the_engine_returned(env: GatewayEnv, engine: LocalEngine) -> None:
    rollout, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 2 + 3?"}], max_tokens=8
    )
    [call] = await env.calls(rollout, 1)
    assert call.prompt_token_ids == (reply.model_extra or {})["prompt_token_ids"]
    assert call.response_token_ids == (reply.choices[0].model_extra or {})["token_ids"]
    assert_sampled_by(engine, call)


async def test_openai_streaming_records_the_streamed_ids(env: GatewayEnv, engine: LocalEngine) -> None:
    rollout, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=8, stream=True
    )
    streamed: list[int] = []
    async for chunk in stream:
        for choice in chunk.choices:
            streamed += (choice.model_extra or {}).get("token_ids") or []
    [call] = await env.calls(rollout, 1)
    assert call.response_token_ids == streamed
    assert_sampled_by(engine, call)


async def test_text_completions_record_the_engine_ids(env: GatewayEnv, engine: LocalEngine) -> None:
    rollout, base_url = await env.rollout()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = await client.completions.create(model=MODEL, prompt="1 2 3", max_tokens=6)
    [call] = await env.calls(rollout, 1)
    assert call.response_token_ids == (reply.choices[0].model_extra or {})["token_ids"]
    assert_sampled_by(engine, call)


async def test_anthropic_messages_streamed_and_not(env: GatewayEnv, engine: LocalEngine) -> None:
    rollout, base_url = await env.rollout()
    client = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "Hello"}]
    message = await client.messages.create(model=MODEL, max_tokens=8, messages=messages, system="Be kind.")
    assert message.stop_reason in ("end_turn", "max_tokens")
    async with client.messages.stream(model=MODEL, max_tokens=8, messages=messages) as stream:
        final = await stream.get_final_message()
    assert final.usage.output_tokens > 0
    for call in await env.calls(rollout, 2):
        assert_sampled_by(engine, call)


async def test_unchanged_agents_naming_hosted_models_are_served_the_rollouts_model(
    env: GatewayEnv, engine: LocalEngine
) -> None:
    """Code written for gpt-4.1-mini or claude-sonnet-4-5 runs as it is: each call is served by the
    model the rollout's resources name, and the record keeps the name the agent sent."""
    await env.store.put_resources({"llm": LLM(endpoint="http://agents-see-the-gateway/v1", model=MODEL)})
    rollout, base_url = await env.rollout()
    chat = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    question: Any = [{"role": "user", "content": "What is 2 + 3?"}]
    await chat.chat.completions.create(model="gpt-4.1-mini", messages=question, max_tokens=8)
    await chat.responses.create(model="gpt-4.1", input="What is 2 + 3?", max_output_tokens=8)
    claude = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    await claude.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=question)
    calls = await env.calls(rollout, 3)
    assert [call.requested_model for call in calls] == ["gpt-4.1-mini", "gpt-4.1", "claude-sonnet-4-5"]
    assert {call.request["model"] for call in calls} == {MODEL}
    for call in calls:
        assert_sampled_by(engine, call)
    # The model's own name is not rewritten, so nothing is recorded as asked for in its place.
    await chat.chat.completions.create(model=MODEL, messages=question, max_tokens=8)
    assert (await env.calls(rollout, 4))[-1].requested_model is None


async def test_a_mapping_names_the_model_for_a_name_sent(engine_url: str) -> None:
    config = GatewayConfig(model_map={"gpt-4.1-mini": "not-this-engine"}, retry_backoff_seconds=0.01)
    async with gateway_env([engine_url], config) as env:
        await env.store.put_resources({"llm": LLM(endpoint="http://unused/v1", model=MODEL)})
        rollout, base_url = await env.rollout()
        chat = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="'not-this-engine' is not served here"):
            await chat.chat.completions.create(
                model="gpt-4.1-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        [call] = await env.calls(rollout, 1)
    assert (call.request["model"], call.requested_model) == ("not-this-engine", "gpt-4.1-mini")
