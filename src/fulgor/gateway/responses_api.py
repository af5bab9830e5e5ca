"""The OpenAI Responses API, translated to and from the engine's chat completions format.

Requests: ``instructions`` becomes a system message; ``input`` (a string, or a list of items:
messages with text content, ``function_call`` items, which join the assistant message before them
as its ``tool_calls``, and ``function_call_output`` items, which become ``tool`` messages) becomes
the chat messages; function tools (the Responses flat shape) become chat tools; ``tool_choice``,
``max_output_tokens`` (``max_tokens``), ``temperature``, ``top_p``, ``parallel_tool_calls`` and a
JSON ``text.format`` (``response_format``) carry over. The gateway keeps no server-side state, so
``previous_response_id``, ``conversation``, stored prompts, item references and background mode
are refused with a 400 that says to send the full input; so are built-in tools (web search, file
search, computer use, ...) and non-text input: the engines take text and function tools only.
Parts with the wrong JSON types are a 400 too, never a crash. Items the engines cannot use and a
model may hand back (``reasoning``) are left out.

Responses: a chat completion becomes a ``response`` object whose ``output`` holds a ``message``
item (``output_text`` content) and one ``function_call`` item per tool call; a length stop makes
it ``incomplete`` with ``incomplete_details``, and the item it cut off ``incomplete`` too.
Streamed chat chunks become the Responses event sequence (``response.created``,
``response.in_progress``, ``response.output_item.added``, ..., ``response.completed`` or
``response.incomplete``), each with its ``sequence_number``; an upstream error chunk, or a stream
that ends without a finish reason, becomes an ``error`` event that ends the stream and makes the
openai SDK raise. Errors take OpenAI's shape (:func:`error_body`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fulgor.gateway._translate import UNFINISHED, JsonDict, objects, sse_event, upstream_error_message
from fulgor.gateway.errors import BadRequestError
from fulgor.limits import quoted

__all__ = ["ResponsesStream", "error_body", "request_to_chat", "response_from_chat"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
}
_NO_STATE = (
    "the gateway keeps no responses or conversations between calls; send the full conversation as "
    "'input' with every call (the OpenAI Agents SDK does by default)"
)
# Request fields that need state or services the gateway does not have, and why they are refused.
_STATEFUL = {
    "previous_response_id": _NO_STATE,
    "conversation": _NO_STATE,
    "prompt": "stored prompts live on OpenAI's servers; send the prompt as 'instructions' and 'input'",
    "background": "background responses are not served; make the call and wait for it, or stream it",
}
_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> JsonDict:
    """An error answer in OpenAI's shape, its type chosen by HTTP status."""
    kind = _ERROR_TYPES.get(status) or ("server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# -- requests -------------------------------------------------------------------------------------


def request_to_chat(body: JsonDict) -> JsonDict:
    """A chat completions request equivalent to a Responses request; BadRequestError (400) for
    what the gateway cannot serve and for parts with the wrong JSON types."""
    for key, why in _STATEFUL.items():
        if body.get(key):
            raise BadRequestError(f"{key} is not supported: {why}")
    messages: list[JsonDict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequestError("instructions must be a string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(body.get("input")))
    chat: JsonDict = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    chat.update({key: body[key] for key in ("temperature", "top_p") if body.get(key) is not None})
    if body.get("tools"):
        chat["tools"] = [_tool(tool) for tool in objects(body["tools"], "tools")]
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _input_messages(value: Any) -> list[JsonDict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None:
        raise BadRequestError("a Responses request needs 'input': a string or a list of input items")
    messages: list[JsonDict] = []
    for item in objects(value, "input (when not a string)"):
        kind = item.get("type")
        if kind == "function_call":
            _add_tool_call(messages, item)
        elif kind == "function_call_output":
            content = _text_of(item.get("output"), "the output of a function_call_output item")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id"), "content": content})
        elif kind == "message" or (kind is None and "role" in item):
            messages.append(_message(item))
        elif kind == "item_reference" or (kind is None and "id" in item):
            raise BadRequestError(f"input items of type 'item_reference' are not supported: {_NO_STATE}")
        elif kind != "reasoning":  # the engines take no reasoning items; the text turns carry on without them
            raise BadRequestError(
                f"input items of type {quoted(kind)} are not supported: the engines behind the gateway take "
                "messages, function_call and function_call_output items only"
            )
    return messages


def _string(item: JsonDict, key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise BadRequestError(f"the {quoted(key)} of a {quoted(item.get('type'))} item must be a string")
    return value


def _add_tool_call(messages: list[JsonDict], item: JsonDict) -> None:
    """A ``function_call`` item joins the assistant message just before it (the turn the model
    answered with), as a chat template renders one assistant turn with text and tool calls."""
    call = {
        "id": _string(item, "call_id"),
        "type": "function",
        "function": {"name": _string(item, "name"), "arguments": _string(item, "arguments")},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _message(item: JsonDict) -> JsonDict:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise BadRequestError(
            f"message role {quoted(role)} is not 'user', 'assistant', 'system' or 'developer'"
        )
    return {"role": role, "content": _text_of(item.get("content"), "message content")}


def _text_of(content: Any, what: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        raise BadRequestError(f"{what} must be a string or a list of content parts")
    parts = []
    for part in objects(content, f"{what} (when not a string)"):
        kind = part.get("type")
        key = "refusal" if kind == "refusal" else "text"
        if kind not in (*_TEXT_PARTS, "refusal"):
            raise BadRequestError(
                f"content parts of type {quoted(kind)} are not supported: the engines behind the "
                "gateway take text only; send input_text"
            )
        if not isinstance(part.get(key), str):
            raise BadRequestError(f"the {quoted(key)} of a {quoted(kind)} part in {what} must be a string")
        parts.append(part[key])
    return "".join(parts)


def _tool(tool: JsonDict) -> JsonDict:
    kind = tool.get("type")
    if kind != "function":
        raise BadRequestError(
            f"tools of type {quoted(kind)} are not supported: built-in tools run on OpenAI's servers, "
            "and the engines behind the gateway take function tools only; define it as a function tool"
        )
    if not isinstance(tool.get("name"), str):
        raise BadRequestError("the 'name' of a function tool must be a string")
    function: JsonDict = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequestError(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}: the engines '
        "behind the gateway take function tools only"
    )


def _response_format(text: Any) -> JsonDict | None:
    """``text.format`` as a chat ``response_format``: plain text needs none; JSON maps over."""
    if text is None:
        return None
    if not isinstance(text, dict) or not isinstance(text.get("format") or {}, dict):
        raise BadRequestError('text must be a JSON object such as {"format": {"type": "text"}}')
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {key: fmt[key] for key in ("name", "schema", "description", "strict") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequestError(
        f"text.format {json.dumps(fmt)[:200]} is not supported: send {{'type': 'text'}}, "
        "{'type': 'json_object'} or {'type': 'json_schema', 'name': ..., 'schema': {...}}"
    )


# -- responses ------------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _response(request: JsonDict, response_id: str, model: Any) -> JsonDict:
    """A ``response`` object for ``request``, before any output: what the request set, echoed."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": request.get("model") or model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
    }


def _finished(response: JsonDict, output: list[JsonDict], finish_reason: Any, usage: JsonDict) -> JsonDict:
    reason = _INCOMPLETE_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None
    input_tokens = usage.get("prompt_tokens", 0)
    output_tokens = usage.get("completion_tokens", 0)
    return {
        **response,
        "status": "incomplete" if reason else "completed",
        "incomplete_details": {"reason": reason} if reason else None,
        "output": output,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", input_tokens + output_tokens),
        },
    }


def _text_part(text: str) -> JsonDict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str) -> JsonDict:
    content = [_text_part(text)] if status != "in_progress" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(item_id: str, call_id: Any, name: Any, arguments: str, status: str) -> JsonDict:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id or item_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def response_from_chat(chat: JsonDict, request: JsonDict) -> JsonDict:
    """A ``response`` object from a chat completion's first choice; ``request`` is the Responses
    request it answers (its settings are echoed, as OpenAI does)."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    finish = choice.get("finish_reason")
    output: list[JsonDict] = []
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        output.append(_message_item(_new_id("msg"), message.get("content") or "", "completed"))
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        output.append(_call_item(_new_id("fc"), call.get("id"), function.get("name"), arguments, "completed"))
    if finish in _INCOMPLETE_REASONS:
        output[-1]["status"] = "incomplete"  # the item being generated when the limit cut it off
    response = _response(request, _new_id("resp"), chat.get("model"))
    return _finished(response, output, finish, chat.get("usage") or {})


# -- streams --------------------------------------------------------------------------------------


@dataclass
class _OpenItem:
    """The output item being streamed: a message (its text so far) or a function call."""

    item: JsonDict
    key: tuple[str, int]  # ("message", 0) or ("call", chat tool call index)
    parts: list[str] = field(default_factory=list)


class ResponsesStream:
    """Turns the chunks of a streamed chat completion into Responses stream events."""

    def __init__(self, request: JsonDict) -> None:
        self.error: str | None = None
        self._request = request
        self._response: JsonDict | None = None
        self._sequence = 0
        self._output: list[JsonDict] = []
        self._open: _OpenItem | None = None
        self._finish_reason: Any = None
        self._usage: JsonDict = {}

    def events(self, chunk: JsonDict) -> list[bytes]:
        """The events for one chat chunk. An error chunk (fulgor's engine and vLLM send
        ``{"error": {...}}`` when generation fails mid-stream) becomes an ``error`` event; it sets
        :attr:`error`, and the stream ends there: later chunks and :meth:`finish` add nothing."""
        if self.error is not None:
            return []
        if chunk.get("error") and not chunk.get("choices"):
            return [self.fail(upstream_error_message(chunk["error"]))]
        events = self._start(chunk.get("model"))
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            events.extend(self._delta(choice.get("delta") or {}))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return events

    def fail(self, message: str) -> bytes:
        """The ``error`` event that ends the stream; sets :attr:`error`. It carries the fields both
        flat (as OpenAI's reference documents) and nested under ``error`` (as the live API sends,
        and as the openai SDK needs to raise ``APIError``)."""
        self.error = message
        flat = {"code": "upstream_error", "message": message, "param": None}
        return self._event("error", {**flat, "error": {"type": "server_error", **flat}})

    def finish(self) -> list[bytes]:
        """The closing events; call once after the last chunk (none after an error). A stream
        that ended without a finish reason was cut short: it ends with an ``error`` event."""
        if self.error is not None:
            return []
        if self._finish_reason is None:
            return [self.fail(UNFINISHED)]
        events = self._start(None)
        status = "incomplete" if self._finish_reason in _INCOMPLETE_REASONS else "completed"
        if not self._output and self._open is None:
            events.extend(self._open_item(("message", 0)))
        events.extend(self._close_item(status))
        assert self._response is not None
        response = _finished(self._response, self._output, self._finish_reason, self._usage)
        events.append(self._event(f"response.{response['status']}", {"response": response}))
        return events

    def _start(self, model: Any) -> list[bytes]:
        if self._response is not None:
            return []
        self._response = _response(self._request, _new_id("resp"), model)
        return [
            self._event("response.created", {"response": self._response}),
            self._event("response.in_progress", {"response": self._response}),
        ]

    def _delta(self, delta: JsonDict) -> list[bytes]:
        events: list[bytes] = []
        if delta.get("content"):
            if self._open is None or self._open.key[0] != "message":
                events.extend(self._open_item(("message", 0)))
            events.append(self._text_delta(delta["content"]))
        for call in delta.get("tool_calls") or []:
            key = ("call", call.get("index", 0))
            function = call.get("function") or {}
            if self._open is None or self._open.key != key:
                events.extend(self._open_item(key, call.get("id"), function.get("name")))
            if function.get("arguments"):
                events.append(self._arguments_delta(function["arguments"]))
        return events

    def _open_item(self, key: tuple[str, int], call_id: Any = None, name: Any = None) -> list[bytes]:
        events = self._close_item("completed")
        if key[0] == "message":
            item = _message_item(_new_id("msg"), "", "in_progress")
        else:
            item = _call_item(_new_id("fc"), call_id, name, "", "in_progress")
        self._open = _OpenItem(item, key)
        events.append(self._event("response.output_item.added", {**self._where(), "item": item}))
        if key[0] == "message":
            where = {**self._where(item_id=True), "content_index": 0}
            events.append(self._event("response.content_part.added", {**where, "part": _text_part("")}))
        return events

    def _text_delta(self, text: str) -> bytes:
        assert self._open is not None
        self._open.parts.append(text)
        where = {**self._where(item_id=True), "content_index": 0}
        return self._event("response.output_text.delta", {**where, "delta": text, "logprobs": []})

    def _arguments_delta(self, arguments: str) -> bytes:
        assert self._open is not None
        self._open.parts.append(arguments)
        where = self._where(item_id=True)
        return self._event("response.function_call_arguments.delta", {**where, "delta": arguments})

    def _close_item(self, status: str) -> list[bytes]:
        """The done events of the open item, which ends with ``status``: ``completed`` when the
        next item starts, ``incomplete`` when a limit cut the response off in it."""
        if self._open is None:
            return []
        item, joined = self._open.item, "".join(self._open.parts)
        where = self._where(item_id=True)
        if self._open.key[0] == "message":
            done = _message_item(item["id"], joined, status)
            text_where = {**where, "content_index": 0}
            events = [
                self._event("response.output_text.done", {**text_where, "text": joined, "logprobs": []}),
                self._event("response.content_part.done", {**text_where, "part": _text_part(joined)}),
            ]
        else:
            done = {**item, "arguments": joined, "status": status}
            events = [self._event("response.function_call_arguments.done", {**where, "arguments": joined})]
        events.append(self._event("response.output_item.done", {**self._where(), "item": done}))
        self._output.append(done)
        self._open = None
        return events

    def _where(self, *, item_id: bool = False) -> JsonDict:
        """Where the open item sits: its ``output_index`` (and ``item_id``)."""
        assert self._open is not None
        where: JsonDict = {"output_index": len(self._output)}
        if item_id:
            where["item_id"] = self._open.item["id"]
        return where

    def _event(self, kind: str, payload: JsonDict) -> bytes:
        event = sse_event(kind, {**payload, "sequence_number": self._sequence})
        self._sequence += 1
        return event
