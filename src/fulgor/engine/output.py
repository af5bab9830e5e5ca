"""Engine output in the OpenAI formats, with vLLM's token-id fields and fulgor's model version.

With ``return_token_ids`` set, chat responses carry ``prompt_token_ids`` on the response and
``token_ids`` on each choice; text completions carry both on each choice (vLLM's layout). Every
response and every stream chunk carries ``model_version``: the weights version that produced it.
Every finished choice carries vLLM's ``stop_reason``: the stop string or stop token id that ended
it, null when it ended on an end-of-sequence token or at its length limit.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fulgor.engine.chat_format import ChatFormat
from fulgor.engine.scheduler import FinishEvent
from fulgor.engine.tool_calls import ParsedOutput

__all__ = [
    "ResponseContext",
    "chat_choice",
    "chat_logprobs",
    "completion_choice",
    "completion_logprobs",
    "usage",
]


@dataclass
class ResponseContext:
    """What every response or chunk of one request shares."""

    tokenizer: Any
    model: str
    kind: str
    tokens_as_ids: bool = False
    chat_format: ChatFormat | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, obj: str, model_version: int) -> dict[str, Any]:
        prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
        return {
            "id": f"{prefix}-{self.id}",
            "object": obj,
            "created": self.created,
            "model": self.model,
            "model_version": model_version,
        }

    def token_text(self, token_id: int) -> str:
        if self.tokens_as_ids:
            return f"token_id:{token_id}"
        text: str = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    @property
    def _format(self) -> ChatFormat:
        return self.chat_format or ChatFormat.own(self.tokenizer)

    def parse(self, text: str, tools_active: bool) -> ParsedOutput:
        """A chat answer's text split by the model's parsers (reasoning, tool calls when active)."""
        return self._format.parse(text, tools_active)

    @property
    def parses_reasoning(self) -> bool:
        """Whether answers are split into reasoning and content (a stream then holds text back)."""
        return self._format.reasoning_parser is not None


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chat_logprob_entry(
    ctx: ResponseContext, token_id: int, logprob: float, top: list[tuple[int, float]]
) -> Any:
    def item(tid: int, lp: float) -> dict[str, Any]:
        text = ctx.token_text(tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {**item(token_id, logprob), "top_logprobs": [item(tid, lp) for tid, lp in top]}


def chat_logprobs(
    ctx: ResponseContext, token_ids: list[int], logprobs: list[float], top: list[list[tuple[int, float]]]
) -> dict[str, Any]:
    """``choices[i].logprobs`` of a chat completion: one entry per generated token."""
    entries = [
        _chat_logprob_entry(ctx, t, lp, tp) for t, lp, tp in zip(token_ids, logprobs, top, strict=True)
    ]
    return {"content": entries, "refusal": None}


def completion_logprobs(
    ctx: ResponseContext,
    token_ids: list[int],
    logprobs: list[float],
    top: list[list[tuple[int, float]]],
    text_offset: int = 0,
) -> dict[str, Any]:
    """``choices[i].logprobs`` of a text completion (the legacy parallel-lists format)."""
    tokens = [ctx.token_text(t) for t in token_ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    top_maps = [{ctx.token_text(tid): lp for tid, lp in entry} for entry in top]
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top_maps, "text_offset": offsets}


def chat_finish_reason(parsed: ParsedOutput, finish_reason: str) -> str:
    return "tool_calls" if parsed.tool_calls and finish_reason == "stop" else finish_reason


def chat_choice(
    ctx: ResponseContext,
    index: int,
    event: FinishEvent,
    *,
    tools_active: bool,
    logprobs: bool,
    return_token_ids: bool,
) -> dict[str, Any]:
    """One choice of a non-streamed chat completion."""
    parsed = ctx.parse(event.text, tools_active)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if parsed.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in parsed.tool_calls]
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(ctx, event.token_ids, event.logprobs, event.top_logprobs)
        if logprobs
        else None,
        "finish_reason": chat_finish_reason(parsed, event.finish_reason),
        "stop_reason": event.stop_reason,
        "model_version": event.model_version,
    }
    if return_token_ids:
        choice["token_ids"] = event.token_ids
    return choice


def completion_choice(
    ctx: ResponseContext,
    index: int,
    event: FinishEvent,
    prompt_ids: list[int],
    *,
    logprobs: bool,
    return_token_ids: bool,
) -> dict[str, Any]:
    """One choice of a non-streamed text completion."""
    choice: dict[str, Any] = {
        "index": index,
        "text": event.text,
        "logprobs": (
            completion_logprobs(ctx, event.token_ids, event.logprobs, event.top_logprobs)
            if logprobs
            else None
        ),
        "finish_reason": event.finish_reason,
        "stop_reason": event.stop_reason,
        "model_version": event.model_version,
    }
    if return_token_ids:
        choice["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = event.token_ids
    return choice
