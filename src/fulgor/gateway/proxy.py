"""forward_call: one model call from the agent to the upstream and back, watched for disconnects.

The request goes upstream with the token id request added (when the replica takes it) and, for a
stream, a request for its usage; a chat call's messages go normalised to the replica's template
when it names a history format (vLLM with a template that renders no tool calls or tool results);
the answer goes back as the upstream's own bytes (OpenAI chat and
text completions) or translated (Anthropic Messages, OpenAI Responses), whole or streamed event by
event. What the upstream sent is kept on the :class:`~fulgor.gateway.recorder.CallRecord` for the
recorder. An answer that breaks off upstream is recorded as an error: a whole one is answered with
502 (504 on a timeout), a stream that has started ends with an error event the agent's SDK raises
on. While the call runs, a watcher waits for the agent to disconnect; if it does, the call is
cancelled, which closes the upstream connection so the engine stops generating.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from fulgor.engine.errors import InvalidRequestError
from fulgor.gateway import anthropic, responses_api
from fulgor.gateway.config import Upstream
from fulgor.gateway.errors import BadRequestError, GatewayError, UpstreamError, UpstreamTimeoutError
from fulgor.gateway.extract import BadEventError, SseParser
from fulgor.gateway.recorder import CallRecord
from fulgor.gateway.upstreams import UpstreamPool, with_token_id_request
from fulgor.net.http_client import HttpResponse, TransportError

__all__ = ["CallContext", "forward_call"]

JsonDict = dict[str, Any]

_SUFFIXES = {"chat": "/chat/completions", "completions": "/completions"}
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

Api = Literal["openai", "anthropic", "responses"]

# What a translator raises on an upstream answer of the wrong shape (a list where a chat completion
# has an object, a number where it has text): the upstream's fault, answered 502 or an error event.
_SHAPE_ERRORS = (AttributeError, KeyError, IndexError, TypeError, ValueError)
_NOT_A_COMPLETION = "upstream answered 200 with a body that is not a chat completion"
_NOT_A_CHUNK = "the upstream sent a stream that is not a chat completion stream"

logger = logging.getLogger(__name__)


@dataclass
class CallContext:
    """One call in flight. ``api`` is the API the agent speaks (``openai``: chat or text
    completions, passed through; ``anthropic`` and ``responses``: translated from and back to chat
    completions); ``request`` is the body the agent sent, before any translation."""

    record: CallRecord
    api: Api
    request: JsonDict
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
    except Exception as error:
        # Whatever went wrong, the agent did not get a whole answer: never record it as one.
        record.error = f"the gateway failed to relay the call ({type(error).__name__}: {error})"
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
    request, strip_usage = _upstream_request(record, replica)
    response, upstream = await pool.send(
        record.rollout_id, "POST", _SUFFIXES[record.endpoint], orjson.dumps(request)
    )
    record.replica = upstream.url
    record.status = response.status
    try:
        if response.status == 200 and record.request.get("stream"):
            await _stream(context, response, strip_usage)
        else:
            await _whole(context, response)
    finally:
        response.abort()


def _upstream_request(record: CallRecord, replica: Upstream) -> tuple[JsonDict, bool]:
    """The request as sent upstream, and whether the agent's stream must lose the usage chunk.

    A chat call's messages are normalised to the replica's ``history_format`` when it has one
    (:func:`_with_history`). A replica asked for token ids gets, for a stream, a request for its
    usage too, so the recorder can check the ids against ``usage.completion_tokens``; when the agent
    did not ask for it, the usage-only chunk is taken out of what the agent receives.
    ``continuous_usage_stats`` (vLLM) only works together with ``include_usage``, so it is dropped
    when fulgor adds ``include_usage``: it had no effect. A replica not asked for ids (an API that
    may reject fields it does not know) gets the agent's request without these additions: its calls
    carry no ids to check.
    """
    sent = _with_history(record, replica)
    if not replica.request_token_ids:
        return sent, False
    request = with_token_id_request(sent, record.endpoint)
    options = record.request.get("stream_options")
    if not record.request.get("stream") or not (options is None or isinstance(options, dict)):
        return request, False
    if options is not None and options.get("include_usage"):
        return request, False
    kept = {key: value for key, value in (options or {}).items() if key != "continuous_usage_stats"}
    return {**request, "stream_options": {**kept, "include_usage": True}}, True


def _with_history(record: CallRecord, replica: Upstream) -> JsonDict:
    """The request with its chat messages as the replica's template renders them: tool calls
    written into the assistant's content, tool results as a user turn (what fulgor's engine does
    before rendering; vLLM renders what it is sent). The record keeps the agent's own messages.
    A tool call without a function name is a 400; messages of another shape go as sent, for the
    engine to refuse."""
    history = replica.history_format
    messages = record.request.get("messages")
    if history is None or record.endpoint != "chat" or not isinstance(messages, list):
        return record.request
    if not all(isinstance(message, dict) for message in messages):
        return record.request
    try:
        return {**record.request, "messages": history.normalise(messages, wire=True)}
    except InvalidRequestError as error:
        raise BadRequestError(error.message) from None
    except (AttributeError, TypeError):  # a tool call or function that is not an object
        return record.request


async def _whole(context: CallContext, response: HttpResponse) -> None:
    try:
        body = context.record.body = await response.read()
    except OSError as error:
        raise _broken_off(error) from None
    status = response.status
    content_type = response.headers.get("content-type", "application/json")
    if context.api == "anthropic":
        model = context.request.get("model")
        status, body = _anthropic_body(context.record, status, model, _stop_sequences(context.record))
        content_type = "application/json"
    elif context.api == "responses":
        status, body = _responses_body(context.record, status, context.request)
        content_type = "application/json"
    headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
    ]
    await context.send({"type": "http.response.start", "status": status, "headers": headers})
    context.finishing = True
    await context.send({"type": "http.response.body", "body": body})


def _broken_off(error: OSError) -> UpstreamError:
    message = f"the upstream's answer broke off ({type(error).__name__}: {error})"
    if isinstance(error, TransportError) and error.timed_out:
        return UpstreamTimeoutError(f"{message}; raise read_timeout_seconds for long generations")
    return UpstreamError(f"{message}; check the engine's log")


def _anthropic_body(
    record: CallRecord, status: int, model: Any, stop_sequences: list[str]
) -> tuple[int, bytes]:
    body = record.body or b""
    parsed = _json_or_none(body)
    if status != 200:
        message = _upstream_error(parsed, body)["message"]
        return status, orjson.dumps(anthropic.error_body(status, f"upstream: {message}"))
    try:
        if isinstance(parsed, dict):
            return 200, orjson.dumps(anthropic.message_from_chat(parsed, model, stop_sequences))
    except _SHAPE_ERRORS:
        pass
    record.error = _NOT_A_COMPLETION  # the agent gets a 502: the call failed
    return 502, orjson.dumps(anthropic.error_body(502, _NOT_A_COMPLETION))


def _responses_body(record: CallRecord, status: int, request: JsonDict) -> tuple[int, bytes]:
    body = record.body or b""
    parsed = _json_or_none(body)
    if status != 200:
        error = _upstream_error(parsed, body)
        code, param = error.get("code"), error.get("param")
        answer = responses_api.error_body(
            status,
            f"upstream: {error['message']}",
            code if isinstance(code, str) else None,
            param if isinstance(param, str) else None,
        )
        return status, orjson.dumps(answer)
    try:
        if isinstance(parsed, dict):
            return 200, orjson.dumps(responses_api.response_from_chat(parsed, request))
    except _SHAPE_ERRORS:
        pass
    record.error = _NOT_A_COMPLETION  # the agent gets a 502: the call failed
    return 502, orjson.dumps(responses_api.error_body(502, _NOT_A_COMPLETION, UpstreamError.code))


def _upstream_error(parsed: Any, body: bytes) -> JsonDict:
    """The upstream's error object (OpenAI's shape) with a string ``message``: the body's own text
    when it names none."""
    error = parsed.get("error") if isinstance(parsed, dict) else None
    error = dict(error) if isinstance(error, dict) else {}
    message = error.get("message")
    error["message"] = message if isinstance(message, str) else body[:2000].decode("utf-8", "replace")
    return error


def _json_or_none(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _stop_sequences(record: CallRecord) -> list[str]:
    # request_to_chat copied the Messages request's stop_sequences here, checked as strings.
    stop = record.request.get("stop")
    return stop if isinstance(stop, list) else []


async def _stream(context: CallContext, response: HttpResponse, strip_usage: bool) -> None:
    """Relay the stream; if it breaks off upstream, record the error and end the agent's stream
    with an error event its SDK raises on, so a cut-short answer is never taken as whole."""
    send = context.send
    record = context.record
    chunks: list[bytes] = []
    record.stream_chunks = chunks
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    relay: _Relay
    if context.api == "anthropic":
        model = context.request.get("model")
        stream = anthropic.AnthropicStream(model if isinstance(model, str) else None, _stop_sequences(record))
        relay = _TranslatingRelay(stream)
    elif context.api == "responses":
        relay = _TranslatingRelay(responses_api.ResponsesStream(context.request))
    else:
        relay = _OpenAIRelay(strip_usage)
    try:
        async for chunk in response.chunks():
            chunks.append(chunk)
            out = relay.feed(chunk)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            if relay.error is not None:
                break
        tail = relay.finish()
    except OSError as error:
        tail = relay.fail(f"the upstream stream broke off ({type(error).__name__}: {error})")
    record.error = relay.error
    context.finishing = True
    await send({"type": "http.response.body", "body": tail})


class _Relay(Protocol):
    @property
    def error(self) -> str | None: ...

    def feed(self, chunk: bytes) -> bytes: ...

    def finish(self) -> bytes: ...

    def fail(self, message: str) -> bytes: ...


class _OpenAIRelay:
    """Passes the upstream's bytes on unchanged, one whole event at a time (so an error event can
    always follow), without the usage-only chunk when fulgor asked for it and the agent did not."""

    def __init__(self, strip_usage: bool) -> None:
        self.error: str | None = None
        self._strip_usage = strip_usage
        self._buffer = b""

    def feed(self, chunk: bytes) -> bytes:
        buffer = self._buffer + chunk
        end = _events_end(buffer)
        self._buffer = buffer[end:]
        return self._pass(buffer[:end])

    def finish(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return self._pass(rest)

    def fail(self, message: str) -> bytes:
        # The openai SDK raises APIError on a data event with an "error" key.
        self.error = message
        self._buffer = b""
        error = {"error": {"message": message, "type": "server_error", "code": UpstreamError.code}}
        return b"data: " + orjson.dumps(error) + b"\n\ndata: [DONE]\n\n"

    def _pass(self, events: bytes) -> bytes:
        if not self._strip_usage or b'"usage"' not in events:
            return events
        parts = _EVENT_END.split(events)  # [event, separator, event, separator, ..., rest]
        kept = [
            parts[i] + (parts[i + 1] if i + 1 < len(parts) else b"")
            for i in range(0, len(parts), 2)
            if not _usage_only(parts[i])
        ]
        return b"".join(kept)


_EVENT_END = re.compile(rb"(\r\n\r\n|\n\n)")


def _events_end(buffer: bytes) -> int:
    """Where the last complete server-sent event in ``buffer`` ends (0 when none has)."""
    lf, crlf = buffer.rfind(b"\n\n"), buffer.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _usage_only(event: bytes) -> bool:
    """True for the chunk that ``include_usage`` adds: usage and no choices."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            payload = _json_or_none(line[5:].strip())
            return isinstance(payload, dict) and bool(payload.get("usage")) and not payload.get("choices")
    return False


class _Translator(Protocol):
    """A stream translator: :class:`~fulgor.gateway.anthropic.AnthropicStream` or
    :class:`~fulgor.gateway.responses_api.ResponsesStream`."""

    error: str | None

    def events(self, chunk: JsonDict) -> list[bytes]: ...

    def finish(self) -> list[bytes]: ...

    def fail(self, message: str) -> bytes: ...


class _TranslatingRelay:
    """Translates chat chunks into another API's stream events; an upstream error chunk ends the stream."""

    def __init__(self, stream: _Translator) -> None:
        self._parser = SseParser()
        self._stream = stream

    @property
    def error(self) -> str | None:
        return self._stream.error

    def feed(self, chunk: bytes) -> bytes:
        try:
            payloads = self._parser.feed(chunk)
        except BadEventError as error:
            return self.fail(str(error))
        events: list[bytes] = []
        for payload in payloads:
            try:
                events.extend(self._stream.events(payload))
            except _SHAPE_ERRORS:
                logger.debug("cannot translate the upstream chunk %.300r", payload, exc_info=True)
                events.append(self.fail(f"{_NOT_A_CHUNK}: {payload!r:.300}"))
                break
        return b"".join(events)

    def finish(self) -> bytes:
        try:
            return b"".join(self._stream.finish())
        except _SHAPE_ERRORS:  # a usage that is not an object, text that is not a string, ...
            logger.debug("cannot close the translated stream", exc_info=True)
            return self.fail(_NOT_A_CHUNK)

    def fail(self, message: str) -> bytes:
        return b"" if self._stream.error is not None else self._stream.fail(message)
