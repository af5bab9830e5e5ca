"""Shared pieces of the gateway integration tests: a rollout to call into, its recorded calls, and
a raw upstream whose answers a test writes byte by byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from fulgor import semconv
from fulgor.gateway import Gateway, GatewayConfig, Upstream, create_gateway_app
from fulgor.net.asgi import serve_asgi
from fulgor.store.base import Store
from fulgor.store.memory import MemoryStore
from fulgor.testing import Sample, ScriptedOpenAIServer
from fulgor.types import AttemptedRollout, ModelCall, RolloutRequest


async def live_rollout(store: Store) -> AttemptedRollout:
    return await store.start_rollout(RolloutRequest(input={"task": "x"}), worker_id="worker-1")


def base_url(gateway: str, rollout: AttemptedRollout) -> str:
    return f"{gateway}/r/{rollout.rollout_id}/{rollout.attempt.attempt_id}/v1"


async def recorded_calls(
    store: Store, rollout: AttemptedRollout, gateway: Any, count: int
) -> list[ModelCall]:
    """The rollout's model calls, once the recorder has written ``count`` of them."""
    await gateway.settle()
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
    upstreams: Sequence[Upstream | str], config: GatewayConfig | None = None, store: Store | None = None
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


JsonDict = dict[str, Any]
RawHandler = Callable[[JsonDict, asyncio.StreamWriter], Awaitable[None]]


class RawUpstream:
    """An upstream on loopback that answers each call with ``handler(request, writer)``: for what
    the scripted server never does (streams cut short, error chunks, hung engines, vLLM fields).
    ``GET .../models`` (the gateway's check when it starts) gets a model list. One request per
    connection; the connection is closed after the handler returns."""

    def __init__(self, handler: RawHandler) -> None:
        self.handler = handler
        self.requests: list[JsonDict] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aenter__(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            length = next(
                (
                    int(line.split(":", 1)[1])
                    for line in head.split("\r\n")
                    if line.startswith("content-length:")
                ),
                0,
            )
            body = await reader.readexactly(length)
            if head.startswith("get "):  # the gateway's check of its upstreams when it starts
                await write_json(writer, {"object": "list", "data": [{"id": "m", "object": "model"}]})
                return
            self.requests.append(json.loads(body) if body else {})
            await self.handler(self.requests[-1], writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


def sse_event(payload: JsonDict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def write_stream(writer: asyncio.StreamWriter, events: Sequence[bytes], *, cut: bool = False) -> None:
    """A 200 event stream, one HTTP chunk per event; ``cut`` drops the connection mid-body, as
    an engine that dies mid-generation does."""
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    for event in events:
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
    await writer.drain()
    if cut:
        await asyncio.sleep(0.05)
        writer.transport.abort()
        return
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def write_json(writer: asyncio.StreamWriter, payload: JsonDict, status: int = 200) -> None:
    body = json.dumps(payload).encode()
    writer.write(
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


async def wait_for_disconnect(upstream: ScriptedOpenAIServer, seconds: float = 2.0) -> None:
    """Until ``upstream`` has seen a client disconnect (the gateway closing a cancelled call)."""
    for _ in range(round(seconds / 0.01)):
        if upstream.disconnects:
            return
        await asyncio.sleep(0.01)


# How an upstream stream can end that a translated stream (Responses, Anthropic Messages) must turn
# into an error event the agent's SDK raises on: (the events after some text, the error's words).
DONE = b"data: [DONE]\n\n"
BROKEN_STREAM_ENDS = [
    pytest.param([DONE], "the upstream stream ended before the answer finished", id="no-finish-reason"),
    pytest.param([b"data: [1, 2]\n\n", DONE], "not a JSON object: \\[1, 2\\]", id="not-an-object"),
    pytest.param([b'data: {"choices": [1]}\n\n', DONE], "not a chat completion stream", id="not-a-chunk"),
    pytest.param(
        [
            sse_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            sse_event({"choices": [], "usage": [1, 2]}),
            DONE,
        ],
        "not a chat completion stream",
        id="usage-not-an-object",
    ),
]
