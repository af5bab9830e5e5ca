"""Gateway configuration checks and mounting the ASGI app inside another app (as ``fulgor serve`` will)."""

from __future__ import annotations

import httpx
import pytest

from fulgor.errors import ConfigError
from fulgor.gateway import GatewayConfig, Upstream, create_gateway_app
from fulgor.net.asgi import serve_asgi
from fulgor.store.memory import MemoryStore
from fulgor.testing import ScriptedOpenAIServer
from fulgor.types import RolloutRequest


def test_upstream_urls_are_checked() -> None:
    with pytest.raises(ConfigError, match="base URL"):
        Upstream("localhost:8000")
    upstream = Upstream("https://api.example.com/v1/")
    assert (upstream.host, upstream.port, upstream.base_path) == ("api.example.com", 443, "/v1")


def test_config_values_are_checked() -> None:
    with pytest.raises(ConfigError):
        GatewayConfig(record_queue_size=0)


def test_the_recorder_takes_its_settings_from_the_config() -> None:
    config = GatewayConfig(record_linger_seconds=0.5)
    gateway = create_gateway_app(MemoryStore(), ["http://127.0.0.1:1/v1"], config)
    assert gateway.recorder.writer.linger_seconds == 0.5


def test_sticky_replica_is_stable() -> None:
    gateway = create_gateway_app(MemoryStore(), ["http://a:1/v1", "http://b:1/v1", "http://c:1/v1"])
    picks = {gateway.upstreams.replica_for(f"rollout-{i}") for i in range(50)}
    assert picks == {0, 1, 2}
    assert gateway.upstreams.replica_for("rollout-7") == gateway.upstreams.replica_for("rollout-7")


async def test_the_gateway_works_mounted_in_a_fastapi_app() -> None:
    from fastapi import FastAPI

    store = MemoryStore()
    rollout = await store.start_rollout(RolloutRequest(input=1), worker_id="w")
    async with ScriptedOpenAIServer() as upstream:
        gateway = create_gateway_app(store, [upstream.url])
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        app.mount("/r", gateway)
        app.mount("/gateway", gateway)
        async with serve_asgi(app) as url:
            base = f"{url}/r/{rollout.rollout_id}/{rollout.attempt.attempt_id}/v1"
            async with httpx.AsyncClient() as http:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                reply = await http.post(f"{base}/chat/completions", json=body)
                assert reply.status_code == 200
                assert (await http.get(f"{url}/gateway/state")).json()["in_flight"] == 0
                assert (await http.get(f"{url}/health")).json() == {"status": "ok"}
        await gateway.settle()
        assert len(await store.query_spans(rollout.rollout_id)) == 1
        await gateway.close()
