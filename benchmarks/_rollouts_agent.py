"""The agent of benchmarks/rollouts.py: six chat calls through the gateway, then a reward.

It is an ordinary agent written with the ``openai`` SDK, so the measurement includes what a real
agent pays per call (client, HTTP, JSON) as well as what fulgor adds (gateway, recording, store).
"""

from __future__ import annotations

from typing import Any

import httpx
from openai import AsyncOpenAI

from fulgor import LLM, emit_reward, rollout

CALLS_PER_ROLLOUT = 6

# Building an AsyncOpenAI client builds an httpx client with a TLS context: about 20 ms of CPU.
# Each rollout needs its own client (its own base URL), so the agent shares one connection pool
# per process, as any agent making many short conversations should.
_HTTP = httpx.AsyncClient(timeout=60)


@rollout
async def six_calls(task: dict[str, Any], llm: LLM) -> None:
    client = AsyncOpenAI(
        base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=0, http_client=_HTTP
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {task['n']}"}]
    for _ in range(CALLS_PER_ROLLOUT):
        reply = await client.chat.completions.create(model=llm.model, messages=messages)  # type: ignore[arg-type]
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": "go on"})
    emit_reward(1.0)
