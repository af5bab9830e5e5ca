"""A store that is away for a few seconds in the middle of a rollout loses no model call and no span.

Everything is real: a SQLite store file, the gateway on loopback in front of a scripted OpenAI
upstream, a runner running an openai-SDK agent. Another process's connection holds the file's
write lock for three seconds while the agent makes its last calls and emits its reward, so every
write in that time fails with StoreUnavailableError (a SQLite lock held past the store's busy
timeout); the span writers retry until the store is back.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fulgor import semconv
from fulgor.agent import emit_reward, rollout
from fulgor.gateway import GatewayConfig, create_gateway_app
from fulgor.net.asgi import serve_asgi
from fulgor.runner import Runner, RunnerConfig
from fulgor.store import SqliteStore
from fulgor.testing import ScriptedOpenAIServer
from fulgor.types import LLM, ModelCall, RolloutRequest

openai = pytest.importorskip("openai")

OUTAGE_SECONDS = 3.0


class Outage:
    """Holds the store file's write lock from a connection of its own while ``active``."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.began = asyncio.Event()
        self.ended = asyncio.Event()

    async def hold(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        self.began.set()
        await asyncio.sleep(OUTAGE_SECONDS)
        self._conn.execute("ROLLBACK")
        self._conn.close()
        self.ended.set()


async def test_a_store_away_for_seconds_mid_rollout_loses_no_model_call(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = SqliteStore(path, busy_timeout_seconds=0.1)
    outage = Outage(path)
    outages: list[asyncio.Task[None]] = []

    @rollout
    async def agent(task: dict[str, Any], llm: LLM) -> None:
        client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "-")
        for turn in range(4):
            if turn == 2:  # the store goes away for the last two calls and the reward
                outages.append(asyncio.create_task(outage.hold()))
                await outage.began.wait()
            await client.chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": f"turn {turn}"}]
            )
        emit_reward(1.0)
        await client.close()

    async with ScriptedOpenAIServer() as upstream:
        gateway = create_gateway_app(store, [upstream.url], GatewayConfig(record_linger_seconds=0.01))
        async with serve_asgi(gateway) as gateway_url:
            await store.put_resources({"llm": LLM(endpoint=upstream.url, model="scripted-model")})
            [queued] = await store.enqueue([RolloutRequest(input={})])
            config = RunnerConfig(claim_wait_seconds=0.2, heartbeat_seconds=0.5, gateway_url=gateway_url)
            runner = Runner(agent, store, config=config)
            running = asyncio.create_task(runner.run())
            try:
                [done] = await store.wait([queued.rollout_id], timeout_seconds=60)
            finally:
                runner.stop()
                await asyncio.wait_for(running, timeout=30)
            assert outage.ended.is_set()
            assert await gateway.settle([queued.rollout_id])
            retries = gateway.recorder.writer.stats.retries
            lost = gateway.spans_lost(queued.rollout_id)
            await gateway.close()
    [attempt] = await store.list_attempts(queued.rollout_id)
    spans = await store.query_spans(queued.rollout_id)
    await store.close()

    assert done.status == "succeeded", attempt.error
    assert retries >= 1  # the gateway's writes did meet the outage
    assert (lost, attempt.metadata.get(semconv.ATTEMPT_SPANS_LOST, 0)) == (0, 0)
    calls = [
        ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL])
        for s in spans
        if s.name == semconv.SPAN_MODEL_CALL
    ]
    assert [call.request["messages"][0]["content"] for call in calls] == [f"turn {i}" for i in range(4)]
    assert all(call.response_token_ids and not call.token_ids_missing for call in calls)
    assert [s.attributes[semconv.ATTR_REWARD_VALUE] for s in spans if s.name == semconv.SPAN_REWARD] == [1.0]
