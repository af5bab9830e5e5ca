"""Shared pieces of the gateway integration tests: a rollout to call into and its recorded calls."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fulgor import semconv
from fulgor.gateway import Gateway, GatewayConfig, create_gateway_app
from fulgor.net.asgi import serve_asgi
from fulgor.store.base import Store
from fulgor.store.memory import MemoryStore
from fulgor.testing import Sample
from fulgor.types import AttemptedRollout, ModelCall, RolloutRequest


async def live_rollout(store: Store) -> AttemptedRollout:
    return await store.start_rollout(RolloutRequest(input={"task": "x"}), worker_id="worker-1")


def base_url(gateway: str, rollout: AttemptedRollout) -> str:
    return f"{gateway}/r/{rollout.rollout_id}/{rollout.attempt.attempt_id}/v1"


async def recorded_calls(
    store: Store, rollout: AttemptedRollout, gateway: Any, count: int
) -> list[ModelCall]:
    """The rollout's model calls, once the recorder has written ``count`` of them."""
    await gateway.recorder.flushed()
    spans = await store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL)
    assert len(spans) == count, [s.attributes for s in spans]
    return [ModelCall.model_validate(span.attributes[semconv.ATTR_MODEL_CALL]) for span in spans]


class GatewayEnv:
    """A gateway on loopback in front of one or more upstreams, with its store."""

    def __init__(self, gateway: Gateway, url: str, store: Store) -> None:
        self.gateway = gateway
        self.url = url
        self.store = store

    async def rollout(self) -> tuple[AttemptedRollout, str]:
        rollout = await live_rollout(self.store)
        return rollout, base_url(self.url, rollout)

    async def calls(self, rollout: AttemptedRollout, count: int) -> list[ModelCall]:
        return await recorded_calls(self.store, rollout, self.gateway, count)


@contextlib.asynccontextmanager
async def gateway_env(
    upstreams: list[str], config: GatewayConfig | None = None, store: Store | None = None
) -> AsyncIterator[GatewayEnv]:
    store = store or MemoryStore()
    gateway = create_gateway_app(store, upstreams, config or GatewayConfig(retry_backoff_seconds=0.01))
    async with serve_asgi(gateway) as url:
        yield GatewayEnv(gateway, url, store)


def assert_matches(call: ModelCall, sample: Sample) -> None:
    """The recorded call carries exactly the ids and logprobs the upstream sampled."""
    assert not call.token_ids_missing
    assert call.prompt_token_ids == sample.prompt_token_ids
    assert call.response_token_ids == sample.token_ids
    assert call.response_logprobs == sample.logprobs
