"""Load held: 32 agents making 200 calls each through the gateway, every call answered and recorded
with its token ids, and the process's memory settling instead of growing with the calls.

Real components: a SQLite store, the gateway on loopback, a scripted OpenAI upstream, the openai
SDK (one shared HTTP client per agent, as long-running agents keep them).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai

from fulgor import semconv
from fulgor.gateway import GatewayConfig, create_gateway_app
from fulgor.net.asgi import serve_asgi
from fulgor.store import SqliteStore
from fulgor.testing import ScriptedOpenAIServer
from fulgor.types import ModelCall, RolloutRequest

AGENTS = 32
CALLS = 200  # per agent, in rounds of ROUND
ROUND = 50
# Allocator and cache warm-up happen in the first round; the next three (4,800 calls) must leave
# less than 4 MiB behind: under 1 KB a call, where a call's request and record take a few KB.
GROWTH_LIMIT_BYTES = 4 * 1024 * 1024


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def test_32_agents_making_200_calls_each_all_answered_and_recorded(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.sqlite")
    async with ScriptedOpenAIServer() as upstream:
        gateway = create_gateway_app(store, [upstream.url], GatewayConfig())
        async with serve_asgi(gateway) as url:
            rollouts = [await store.start_rollout(RolloutRequest(input=i), "w") for i in range(AGENTS)]
            clients = [
                openai.AsyncOpenAI(
                    base_url=f"{url}/r/{r.rollout_id}/{r.attempt.attempt_id}/v1",
                    api_key="-",
                    max_retries=0,
                    http_client=httpx.AsyncClient(timeout=60),
                )
                for r in rollouts
            ]

            async def agent(client: openai.AsyncOpenAI, turns: int) -> int:
                answered = 0
                for turn in range(turns):
                    reply = await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": f"turn {turn}"}]
                    )
                    answered += bool(reply.choices[0].message.content)
                return answered

            sizes = []
            answered = 0
            for _ in range(CALLS // ROUND):
                answered += sum(await asyncio.gather(*(agent(client, ROUND) for client in clients)))
                await gateway.settle()
                # The scripted upstream keeps every request it saw (it runs in this process): what
                # is measured is the gateway's memory, not the test fake's.
                for kept in (upstream.samples, upstream.requests, upstream.request_headers):
                    kept.clear()
                sizes.append(resident_bytes())
            for client in clients:
                await client.close()
            state = gateway.state()
    spans = [s for r in rollouts for s in await store.query_spans(r.rollout_id, name=semconv.SPAN_MODEL_CALL)]
    await store.close()
    calls = [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]
    assert answered == AGENTS * CALLS
    assert len(calls) == AGENTS * CALLS
    assert all(call.response_token_ids and call.error is None for call in calls)
    assert (state["recorder"]["spans_lost"], state["recorder"]["pending"]) == (0, 0)
    assert sizes[-1] - sizes[0] < GROWTH_LIMIT_BYTES, sizes
