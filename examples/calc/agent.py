"""The calc agent, written with the plain ``openai`` SDK: ask, call the calculator, answer.

Nothing in it knows about training: fulgor hands it an ``llm`` resource whose endpoint is the
rollout's gateway URL, and the reward is the task's own check of the final answer. The same code
runs against any OpenAI-compatible model.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import httpx
from openai import AsyncOpenAI

from examples.calc.calculator import CALCULATOR_TOOL, MAX_TURNS, SYSTEM_PROMPT, calculate, run_tool
from examples.calc.reward import reward
from fulgor import LLM, rollout

__all__ = ["CALCULATOR_TOOL", "SYSTEM_PROMPT", "calc_agent", "calculate", "http_client", "run_tool"]


def http_client() -> httpx.AsyncClient:
    """One connection pool per event loop, shared by the rollouts on it.

    Each rollout has its own gateway URL and so its own ``AsyncOpenAI``; building a fresh HTTP
    client (and TLS context) for each costs more CPU than a short rollout's model calls.
    """
    loop = asyncio.get_running_loop()
    client = _HTTP_CLIENTS.get(loop)
    if client is None or client.is_closed:
        client = _HTTP_CLIENTS[loop] = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))
    return client


_HTTP_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


@rollout
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """One problem: up to MAX_TURNS model calls; tool calls are answered by the calculator."""
    client = AsyncOpenAI(
        base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=2, http_client=http_client()
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    final: str | None = None
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model=llm.model, messages=messages, tools=[CALCULATOR_TOOL], **llm.sampling_parameters
        )  # type: ignore[call-overload]
        message = response.choices[0].message
        if not message.tool_calls:
            final = message.content
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return reward(final, task["answer"])
