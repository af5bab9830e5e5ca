"""Server-sent event streams for chat and text completions.

Each choice's first chunk carries the assistant role (chat) and, with ``return_token_ids``, the
prompt ids; every token then gets a chunk with its text delta, its ``token_ids`` and its logprobs as
requested. When tools are active, or the model's reasoning is parsed, text is held back until the
sequence ends, because only then can the output be told apart from a tool call or reasoning; the
last chunk then carries the ``reasoning_content``, the content and the ``tool_calls``. The chunk
that ends a choice carries its ``finish_reason`` and vLLM's ``stop_reason`` (text completion chunks
carry both on every chunk, null until the end, as vLLM's do). With ``stream_options.include_usage``
a last chunk with no choices carries the ``usage`` of the whole request. An engine error mid-stream
becomes an ``error`` event before ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fulgor.engine.errors import EngineError
from fulgor.engine.local import LocalEngine
from fulgor.engine.output import (
    ResponseContext,
    chat_finish_reason,
    chat_logprobs,
    completion_logprobs,
    usage,
)
from fulgor.engine.protocol import ChatCompletionRequest, CompletionRequest
from fulgor.engine.sampling import SamplingParams
from fulgor.engine.scheduler import FinishEvent, TokenEvent

__all__ = ["chat_stream", "completion_stream"]

_DONE = "data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _error_event(error: EngineError) -> str:
    return _sse(
        {"error": {"message": error.message, "type": "server_error", "code": error.code, "param": None}}
    )


class _ChatChunks:
    """Builds the chunks of one streamed chat completion."""

    def __init__(self, ctx: ResponseContext, body: ChatCompletionRequest, prompt_ids: list[int]) -> None:
        self.ctx = ctx
        self.body = body
        self.prompt_ids = prompt_ids
        self.started: set[int] = set()
        self.sent_text: dict[int, str] = {}
        self.completion_tokens = 0

    def _chunk(self, version: int, choice: dict[str, Any], first: bool = False) -> str:
        payload = self.ctx.envelope("chat.completion.chunk", version)
        payload["choices"] = [choice]
        if first and self.body.return_token_ids:
            payload["prompt_token_ids"] = self.prompt_ids
        return _sse(payload)

    def opening(self, index: int, version: int) -> list[str]:
        if index in self.started:
            return []
        self.started.add(index)
        self.sent_text[index] = ""
        delta = {"role": "assistant", "content": ""}
        return [
            self._chunk(
                version, {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}, True
            )
        ]

    def token(self, index: int, event: TokenEvent) -> list[str]:
        self.completion_tokens += 1
        text = "" if self.body.tools_active or self.ctx.parses_reasoning else event.text
        if not text and not self.body.logprobs and not self.body.return_token_ids:
            return []
        self.sent_text[index] += text
        choice: dict[str, Any] = {
            "index": index,
            "delta": {"content": text} if text else {},
            "finish_reason": None,
        }
        choice["logprobs"] = (
            chat_logprobs(self.ctx, [event.token_id], [event.logprob], [event.top_logprobs])
            if self.body.logprobs
            else None
        )
        if self.body.return_token_ids:
            choice["token_ids"] = [event.token_id]
        return [self._chunk(event.model_version, choice)]

    def finish(self, index: int, event: FinishEvent) -> list[str]:
        parsed = self.ctx.parse(event.text, self.body.tools_active)
        delta: dict[str, Any] = {}
        if parsed.reasoning_content is not None:
            delta["reasoning_content"] = parsed.reasoning_content
        if parsed.tool_calls:
            calls = [{"index": k, **call.to_openai()} for k, call in enumerate(parsed.tool_calls)]
            delta["tool_calls"] = calls
        rest = (parsed.content or "")[len(self.sent_text[index]) :]
        if rest:
            delta["content"] = rest
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": chat_finish_reason(parsed, event.finish_reason),
            "stop_reason": event.stop_reason,
        }
        return [self._chunk(event.model_version, choice)]


async def chat_stream(
    engine: LocalEngine,
    ctx: ResponseContext,
    body: ChatCompletionRequest,
    prompt_ids: list[int],
    params: list[SamplingParams],
) -> AsyncIterator[str]:
    """SSE lines of a streamed chat completion, ending with ``data: [DONE]``."""
    chunks = _ChatChunks(ctx, body, prompt_ids)
    version = engine.model_version
    try:
        async for index, event in engine.generate(prompt_ids, params, stream=True):
            version = event.model_version if isinstance(event, TokenEvent | FinishEvent) else version
            for line in chunks.opening(index, version):
                yield line
            if isinstance(event, TokenEvent):
                for line in chunks.token(index, event):
                    yield line
            elif isinstance(event, FinishEvent):
                for line in chunks.finish(index, event):
                    yield line
    except EngineError as exc:
        yield _error_event(exc)
    else:
        if body.include_usage_in_stream:
            payload = ctx.envelope("chat.completion.chunk", version)
            payload.update(choices=[], usage=usage(len(prompt_ids), chunks.completion_tokens))
            yield _sse(payload)
    yield _DONE


async def completion_stream(
    engine: LocalEngine,
    ctx: ResponseContext,
    body: CompletionRequest,
    prompt_ids: list[int],
    params: list[SamplingParams],
) -> AsyncIterator[str]:
    """SSE lines of a streamed text completion of one prompt, ending with ``data: [DONE]``."""
    sent: dict[int, str] = {}
    completion_tokens = 0
    version = engine.model_version
    try:
        async for index, event in engine.generate(prompt_ids, params, stream=True):
            first = index not in sent
            sent.setdefault(index, "")
            choice: dict[str, Any] = {
                "index": index,
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
            }
            if isinstance(event, TokenEvent):
                completion_tokens += 1
                version = event.model_version
                choice["text"] = event.text
                if body.logprobs is not None:
                    offset = len(sent[index])
                    choice["logprobs"] = completion_logprobs(
                        ctx, [event.token_id], [event.logprob], [event.top_logprobs], offset
                    )
                if body.return_token_ids:
                    choice["token_ids"] = [event.token_id]
                sent[index] += event.text
            elif isinstance(event, FinishEvent):
                version = event.model_version
                choice["text"] = event.text[len(sent[index]) :]
                choice["finish_reason"] = event.finish_reason
                choice["stop_reason"] = event.stop_reason
            if first and body.return_token_ids:
                choice["prompt_token_ids"] = prompt_ids
            payload = ctx.envelope("text_completion", version)
            payload["choices"] = [choice]
            yield _sse(payload)
    except EngineError as exc:
        yield _error_event(exc)
    else:
        if body.include_usage_in_stream:
            payload = ctx.envelope("text_completion", version)
            payload.update(choices=[], usage=usage(len(prompt_ids), completion_tokens))
            yield _sse(payload)
    yield _DONE
