"""forward_call: one model call from the agent to the upstream and back, watched for disconnects.

The request goes upstream with the token id request added (when the replica takes it); the answer
goes back as the upstream's own bytes (OpenAI) or translated (Anthropic), whole or streamed chunk by
chunk. What the agent received is kept on the :class:`~fulgor.gateway.recorder.CallRecord` for the
recorder. While the call runs, a watcher waits for the agent to disconnect; if it does, the call is
cancelled, which closes the upstream connection so the engine stops generating.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson

from fulgor.gateway import anthropic
from fulgor.gateway.errors import GatewayError
from fulgor.gateway.extract import SseParser
from fulgor.gateway.recorder import CallRecord
from fulgor.gateway.upstreams import UpstreamPool, with_token_id_request
from fulgor.net.http_client import HttpResponse

__all__ = ["CallContext", "forward_call"]

_SUFFIXES = {"chat": "/chat/completions", "completions": "/completions"}
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass
class CallContext:
    record: CallRecord
    is_anthropic: bool
    model: Any
    receive: Any
    send: Any
    finishing: bool = False
    disconnected: bool = False


async def forward_call(pool: UpstreamPool, context: CallContext) -> None:
    """Forward, answer, and fill in the record; the agent going away ends the call quietly."""
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.get_running_loop().create_task(_watch_disconnect(context, task))
    record = context.record
    started = time.perf_counter()
    try:
        await _forward(pool, context)
    except asyncio.CancelledError:
        if not context.disconnected:
            raise
        task.uncancel()
        record.error = "the agent disconnected; the upstream call was cancelled"
    except GatewayError as error:
        record.error = error.message
        raise
    finally:
        context.finishing = True
        watcher.cancel()
        record.latency_seconds = time.perf_counter() - started
        record.end_time = time.time()


async def _watch_disconnect(context: CallContext, task: asyncio.Task[Any]) -> None:
    while (await context.receive())["type"] != "http.disconnect":
        pass
    if not context.finishing:
        context.disconnected = True
        task.cancel()


async def _forward(pool: UpstreamPool, context: CallContext) -> None:
    record = context.record
    replica = pool.upstreams[pool.replica_for(record.rollout_id)]
    request = (
        with_token_id_request(record.request, record.endpoint)
        if replica.request_token_ids
        else record.request
    )
    response, upstream = await pool.send(
        record.rollout_id, "POST", _SUFFIXES[record.endpoint], orjson.dumps(request)
    )
    record.replica = upstream.url
    record.status = response.status
    try:
        if response.status == 200 and record.request.get("stream"):
            await _stream(context, response)
        else:
            await _whole(context, response)
    finally:
        response.abort()


async def _whole(context: CallContext, response: HttpResponse) -> None:
    body = context.record.body = await response.read()
    content_type = response.headers.get("content-type", "application/json")
    if context.is_anthropic:
        body = _anthropic_body(response.status, body, context.model)
        content_type = "application/json"
    headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
    ]
    await context.send({"type": "http.response.start", "status": response.status, "headers": headers})
    context.finishing = True
    await context.send({"type": "http.response.body", "body": body})


def _anthropic_body(status: int, body: bytes, model: Any) -> bytes:
    if status == 200:
        return orjson.dumps(anthropic.message_from_chat(orjson.loads(body), model))
    message = body[:2000].decode("utf-8", "replace")
    return orjson.dumps({"type": "error", "error": {"type": "api_error", "message": f"upstream: {message}"}})


async def _stream(context: CallContext, response: HttpResponse) -> None:
    send = context.send
    chunks: list[bytes] = []
    context.record.stream_chunks = chunks
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    translator = _AnthropicTranslator(context.model) if context.is_anthropic else None
    async for chunk in response.chunks():
        chunks.append(chunk)
        out = translator.feed(chunk) if translator is not None else chunk
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
    tail = translator.finish() if translator is not None else b""
    context.finishing = True
    await send({"type": "http.response.body", "body": tail})


class _AnthropicTranslator:
    def __init__(self, model: Any) -> None:
        self._parser = SseParser()
        self._stream = anthropic.AnthropicStream(model if isinstance(model, str) else None)

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(
            event for payload in self._parser.feed(chunk) for event in self._stream.events(payload)
        )

    def finish(self) -> bytes:
        return b"".join(self._stream.finish())
