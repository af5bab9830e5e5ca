"""The Anthropic Messages API, translated to and from the engine's chat completions format.

Requests: ``system`` becomes a system message; ``tool_result`` blocks become ``tool`` messages;
``tool_use`` blocks become assistant ``tool_calls``; ``tools`` and ``tool_choice`` map to their
function-calling equivalents; ``stop_sequences`` becomes ``stop``. A request whose parts have the
wrong JSON types is refused with a 400, never a crash. Responses map back to content blocks
(``text``, ``tool_use``) with ``stop_reason`` (``stop_sequence`` when the engine names the matched
stop string in the choice's ``stop_reason``, as vLLM does); streamed chat chunks become the Messages
event sequence (``message_start``, ``content_block_*``, ``message_delta``, ``message_stop``), and an
upstream error chunk, or a stream that ends without a finish reason, becomes an ``error`` event
that ends the stream. Errors take Anthropic's shape and error types (:func:`error_body`). Images
and documents are refused with a clear error: the engines behind the gateway take text only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fulgor.gateway._translate import UNFINISHED, JsonDict, objects, sse_event, upstream_error_message
from fulgor.gateway.errors import BadRequestError
from fulgor.limits import quoted

__all__ = ["AnthropicStream", "error_body", "error_event", "message_from_chat", "request_to_chat"]

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}
_SAMPLING_KEYS = ("temperature", "top_p", "top_k")
# https://docs.anthropic.com/en/api/errors; 409 has no type of its own.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> JsonDict:
    """An error answer in Anthropic's shape, its type chosen by HTTP status."""
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_event(message: str) -> bytes:
    """The stream event that makes the Anthropic SDK raise (sent after a stream has started)."""
    return sse_event("error", {"error": {"type": "api_error", "message": message}})


def request_to_chat(body: JsonDict) -> JsonDict:
    """A chat completions request equivalent to a Messages request; BadRequestError (400) when
    the request's parts have the wrong JSON types."""
    if not isinstance(body.get("messages"), list):
        raise BadRequestError("a Messages request needs a 'messages' list")
    messages: list[JsonDict] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    for message in objects(body["messages"], "messages"):
        messages.extend(_messages_of(message))
    chat: JsonDict = {"model": body.get("model"), "messages": messages}
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    chat.update({key: body[key] for key in _SAMPLING_KEYS if body.get(key) is not None})
    if body.get("stop_sequences"):
        chat["stop"] = _stop_sequences(body["stop_sequences"])
    if body.get("tools"):
        chat["tools"] = [_tool(tool) for tool in objects(body["tools"], "tools")]
    if body.get("tool_choice"):
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _stop_sequences(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise BadRequestError("stop_sequences must be a list of strings")
    return value


def _blocks(content: Any, what: str) -> list[JsonDict]:
    """Content given as a list of blocks (None counts as no blocks)."""
    return [] if content is None else objects(content, f"{what} (when not a string)")


def _text_of(content: Any, what: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in _blocks(content, what):
        kind = block.get("type")
        if kind == "text":
            text = block.get("text", "")
            if not isinstance(text, str):
                raise BadRequestError(f"the 'text' of a text block in {what} must be a string")
            parts.append(text)
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadRequestError(f"content blocks of type {quoted(kind)} are not supported here; send text")
    return "".join(parts)


def _messages_of(message: JsonDict) -> list[JsonDict]:
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise BadRequestError(f"message role {quoted(role)} is not 'user' or 'assistant'")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = _blocks(content, "message content")
    if role == "assistant":
        return [_assistant_message(blocks)]
    results = [_tool_message(block) for block in blocks if block.get("type") == "tool_result"]
    rest = [block for block in blocks if block.get("type") != "tool_result"]
    return results + ([{"role": "user", "content": _text_of(rest, "message content")}] if rest else [])


def _assistant_message(blocks: list[JsonDict]) -> JsonDict:
    text = _text_of([block for block in blocks if block.get("type") != "tool_use"], "message content")
    message: JsonDict = {"role": "assistant", "content": text or None}
    calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input") or {})},
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_message(block: JsonDict) -> JsonDict:
    content = _text_of(block.get("content") or "", "tool_result content")
    if block.get("is_error"):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": content}


def _tool(tool: JsonDict) -> JsonDict:
    function: JsonDict = {
        "name": tool.get("name"),
        "parameters": tool.get("input_schema") or {"type": "object"},
    }
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        raise BadRequestError('tool_choice must be a JSON object such as {"type": "auto"}')
    kind = str(choice.get("type"))
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind, "auto")


def message_from_chat(chat: JsonDict, model: str | None, stop_sequences: Sequence[str] = ()) -> JsonDict:
    """A Messages response from a chat completion's first choice; ``stop_sequences`` are the
    request's, so a stop on one of them is reported as ``stop_sequence``."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[JsonDict] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(_tool_use_block(call.get("id"), function.get("name"), function.get("arguments")))
    usage = chat.get("usage") or {}
    stop_reason, stop_sequence = _stop_reason(choice, stop_sequences)
    return {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model or chat.get("model"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        },
    }


def _stop_reason(choice: JsonDict, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence`` of a finished chat choice. vLLM names the stop string
    that matched in the choice's ``stop_reason`` (an int there is a stop token id, not a sequence)."""
    finish = choice.get("finish_reason") or "stop"
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish, "end_turn"), None


def _tool_use_block(call_id: Any, name: Any, arguments: Any) -> JsonDict:
    try:
        parsed = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        parsed = {"_raw": arguments}
    return {"type": "tool_use", "id": call_id or "toolu_0", "name": name, "input": parsed}


def _message_id(chat_id: Any) -> str:
    return f"msg_{chat_id or 'fulgor'}"


class AnthropicStream:
    """Turns the chunks of a streamed chat completion into Messages stream events."""

    def __init__(self, model: str | None, stop_sequences: Sequence[str] = ()) -> None:
        self.model = model
        self.error: str | None = None
        self._stop_sequences = stop_sequences
        self._started = False
        self._open: tuple[str, int] | None = None  # ("text" | "tool", chat tool index)
        self._index = -1
        self._stop: tuple[str, str | None] | None = None  # (stop_reason, stop_sequence) once finished
        self._usage: JsonDict = {}
        self._input_tokens = 0

    def events(self, chunk: JsonDict) -> list[bytes]:
        """The events for one chat chunk. An error chunk (fulgor's engine and vLLM send
        ``{"error": {...}}`` when generation fails mid-stream) becomes an ``error`` event; it sets
        :attr:`error`, and the stream ends there: later chunks and :meth:`finish` add nothing."""
        if self.error is not None:
            return []
        if chunk.get("error") and not chunk.get("choices"):
            return [self.fail(upstream_error_message(chunk["error"]))]
        events = [] if self._started else [self._start(chunk)]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            events.extend(self._delta(choice.get("delta") or {}))
            if choice.get("finish_reason"):
                self._stop = _stop_reason(choice, self._stop_sequences)
        return events

    def fail(self, message: str) -> bytes:
        """The ``error`` event that ends the stream; sets :attr:`error`."""
        self.error = message
        return error_event(message)

    def finish(self) -> list[bytes]:
        """The closing events; call once after the last chunk (none after an error). A stream
        that ended without a finish reason was cut short: it ends with an ``error`` event."""
        if self.error is not None:
            return []
        if self._stop is None:
            return [self.fail(UNFINISHED)]
        events = [] if self._started else [self._start({})]
        events.extend(self._close_block())
        output_tokens = self._usage.get("completion_tokens", 0)
        delta = {"stop_reason": self._stop[0], "stop_sequence": self._stop[1]}
        events.append(sse_event("message_delta", {"delta": delta, "usage": {"output_tokens": output_tokens}}))
        events.append(sse_event("message_stop", {}))
        return events

    def _start(self, chunk: JsonDict) -> bytes:
        self._started = True
        self._input_tokens = len(chunk.get("prompt_token_ids") or [])
        message: JsonDict = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.model or chunk.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
        }
        return sse_event("message_start", {"message": message})

    def _delta(self, delta: JsonDict) -> list[bytes]:
        events: list[bytes] = []
        if delta.get("content"):
            if self._open is None or self._open[0] != "text":
                events.extend(self._open_block(("text", 0), {"type": "text", "text": ""}))
            events.append(self._block_delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            key = ("tool", call.get("index", 0))
            function = call.get("function") or {}
            if self._open != key:
                block = {"type": "tool_use", "id": call.get("id") or "toolu_0", "name": function.get("name")}
                events.extend(self._open_block(key, {**block, "input": {}}))
            if function.get("arguments"):
                events.append(
                    self._block_delta({"type": "input_json_delta", "partial_json": function["arguments"]})
                )
        return events

    def _open_block(self, key: tuple[str, int], block: JsonDict) -> list[bytes]:
        events = self._close_block()
        self._index += 1
        self._open = key
        events.append(sse_event("content_block_start", {"index": self._index, "content_block": block}))
        return events

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [sse_event("content_block_stop", {"index": self._index})]

    def _block_delta(self, delta: JsonDict) -> bytes:
        return sse_event("content_block_delta", {"index": self._index, "delta": delta})
