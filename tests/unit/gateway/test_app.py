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


def test_the_command_line_hands_its_model_map_and_version_to_the_gateway() -> None:
    import argparse

    from fulgor.cli.gateway import add_upstream_arguments, build_gateway

    parser = argparse.ArgumentParser()
    add_upstream_arguments(parser, required=True)
    args = parser.parse_args(
        ["--upstream", "http://127.0.0.1:1/v1", "--model-map", "gpt-4.1-mini=small", "--model-version", "3"]
    )
    gateway = build_gateway(args, MemoryStore(), None)  # the upstream is not up: kept, with a warning
    assert dict(gateway.config.model_map) == {"gpt-4.1-mini": "small"}
    assert gateway.model_version == 3


async def test_the_gateways_state_counts_the_spans_the_store_never_got() -> None:
    async with ScriptedOpenAIServer() as upstream:
        store = MemoryStore()
        gateway = create_gateway_app(store, [upstream.url], GatewayConfig(check_rollouts=False))
        async with serve_asgi(gateway) as url, httpx.AsyncClient() as http:
            # No such rollout in the store: it refuses the call's span, which is counted as lost.
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert (await http.post(f"{url}/r/ro-x/at-x/v1/chat/completions", json=body)).status_code == 200
            await gateway.settle()
            state = (await http.get(f"{url}/gateway/state")).json()
    assert state["recorder"]["spans_lost"] == 1
    assert gateway.spans_lost("ro-x") == 1
