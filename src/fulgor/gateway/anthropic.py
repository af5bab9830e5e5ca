"""The Anthropic Messages API, translated to and from the engine's chat completions format.

Requests: ``system`` becomes a system message; ``tool_result`` blocks become ``tool`` messages;
``tool_use`` blocks become assistant ``tool_calls``; ``tools`` and ``tool_choice`` map to their
function-calling equivalents; ``stop_sequences`` becomes ``stop``. Responses map back to content
blocks (``text``, ``tool_use``) with ``stop_reason``; streamed chat chunks become the Messages event
sequence (``message_start``, ``content_block_*``, ``message_delta``, ``message_stop``). Images and
documents are refused with a clear error: the engines behind the gateway take text only.
"""

from __future__ import annotations

import json
from typing import Any

from fulgor.gateway.errors import BadRequestError

__all__ = ["AnthropicStream", "message_from_chat", "request_to_chat"]

JsonDict = dict[str, Any]

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}
_SAMPLING_KEYS = ("temperature", "top_p", "top_k")


def request_to_chat(body: JsonDict) -> JsonDict:
    """A chat completions request equivalent to a Messages request."""
    if not isinstance(body.get("messages"), list):
        raise BadRequestError("a Messages request needs a 'messages' list")
    messages: list[JsonDict] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system)})
    for message in body["messages"]:
        messages.extend(_messages_of(message))
    chat: JsonDict = {"model": body.get("model"), "messages": messages}
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    chat.update({key: body[key] for key in _SAMPLING_KEYS if body.get(key) is not None})
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("tools"):
        chat["tools"] = [_tool(tool) for tool in body["tools"]]
    if body.get("tool_choice"):
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadRequestError(f"content blocks of type {kind!r} are not supported here; send text")
    return "".join(parts)


def _messages_of(message: JsonDict) -> list[JsonDict]:
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise BadRequestError(f"message role {role!r} is not 'user' or 'assistant'")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        return [_assistant_message(content or [])]
    results = [_tool_message(block) for block in content or [] if block.get("type") == "tool_result"]
    rest = [block for block in content or [] if block.get("type") != "tool_result"]
    return results + ([{"role": "user", "content": _text_of(rest)}] if rest else [])


def _assistant_message(blocks: list[JsonDict]) -> JsonDict:
    text = _text_of([block for block in blocks if block.get("type") != "tool_use"])
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
    content = _text_of(block.get("content") or "")
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


def _tool_choice(choice: JsonDict) -> Any:
    kind = str(choice.get("type"))
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind, "auto")


def message_from_chat(chat: JsonDict, model: str | None) -> JsonDict:
    """A Messages response from a chat completion's first choice."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[JsonDict] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(_tool_use_block(call.get("id"), function.get("name"), function.get("arguments")))
    usage = chat.get("usage") or {}
    return {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model or chat.get("model"),
        "content": content,
        "stop_reason": _STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        },
    }


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

    def __init__(self, model: str | None) -> None:
        self.model = model
        self._started = False
        self._open: tuple[str, int] | None = None  # ("text" | "tool", chat tool index)
        self._index = -1
        self._stop_reason = "end_turn"
        self._usage: JsonDict = {}
        self._input_tokens = 0

    def events(self, chunk: JsonDict) -> list[bytes]:
        events = [] if self._started else [self._start(chunk)]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            events.extend(self._delta(choice.get("delta") or {}))
            if choice.get("finish_reason"):
                self._stop_reason = _STOP_REASONS.get(choice["finish_reason"], "end_turn")
        return events

    def finish(self) -> list[bytes]:
        """The closing events; call once after the last chunk."""
        events = [] if self._started else [self._start({})]
        events.extend(self._close_block())
        output_tokens = self._usage.get("completion_tokens", 0)
        delta = {"stop_reason": self._stop_reason, "stop_sequence": None}
        events.append(_event("message_delta", {"delta": delta, "usage": {"output_tokens": output_tokens}}))
        events.append(_event("message_stop", {}))
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
        return _event("message_start", {"message": message})

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
        events.append(_event("content_block_start", {"index": self._index, "content_block": block}))
        return events

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", {"index": self._index})]

    def _block_delta(self, delta: JsonDict) -> bytes:
        return _event("content_block_delta", {"index": self._index, "delta": delta})


def _event(kind: str, payload: JsonDict) -> bytes:
    data = json.dumps({"type": kind, **payload})
    return f"event: {kind}\ndata: {data}\n\n".encode()
