"""Token ids, logprobs and the response summary of each choice, from upstream responses.

Reads vLLM's fields: with ``return_token_ids`` a chat completion carries ``prompt_token_ids`` at
the top and ``token_ids`` on each choice (streamed: ``prompt_token_ids`` on the first chunk and
``token_ids`` on every chunk); a text completion carries both on each choice. Logprobs come from
OpenAI's ``logprobs`` (``content[].logprob`` for chat, ``token_logprobs`` for text). Whatever is
absent stays None; the recorder then flags the call ``token_ids_missing``. Nothing here guesses
ids from text. A stream's ``usage`` chunk and an ``error`` chunk (sent when generation fails
mid-stream) are kept on the :class:`StreamAccumulator` for the recorder's checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

__all__ = ["BadEventError", "ChoiceRecord", "Endpoint", "SseParser", "StreamAccumulator", "choices_from_body"]

JsonDict = dict[str, Any]
Endpoint = Literal["chat", "completions"]


@dataclass
class ChoiceRecord:
    """One sampled choice: what a ModelCall is built from."""

    prompt_token_ids: list[int] | None
    response_token_ids: list[int] | None
    response_logprobs: list[float] | None
    response: JsonDict
    model_version: int | None = None


def choices_from_body(endpoint: Endpoint, body: JsonDict) -> list[ChoiceRecord]:
    """The choices of a whole (not streamed) response."""
    top_prompt_ids = body.get("prompt_token_ids")
    records = []
    for choice in body.get("choices") or []:
        prompt_ids = top_prompt_ids if endpoint == "chat" else choice.get("prompt_token_ids")
        records.append(
            ChoiceRecord(
                prompt_token_ids=prompt_ids,
                response_token_ids=choice.get("token_ids"),
                response_logprobs=_logprobs(endpoint, choice.get("logprobs")),
                response=_summary(endpoint, body, choice),
                model_version=_version(choice.get("model_version", body.get("model_version"))),
            )
        )
    return records


def _summary(endpoint: Endpoint, body: JsonDict, choice: JsonDict) -> JsonDict:
    summary: JsonDict = {"id": body.get("id"), "model": body.get("model"), "index": choice.get("index", 0)}
    if endpoint == "chat":
        summary["message"] = choice.get("message")
    else:
        summary["text"] = choice.get("text")
    summary["finish_reason"] = choice.get("finish_reason")
    summary["usage"] = body.get("usage")
    return summary


def _logprobs(endpoint: Endpoint, logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    if endpoint == "chat":
        content = logprobs.get("content")
        return [entry["logprob"] for entry in content] if isinstance(content, list) else None
    values = logprobs.get("token_logprobs")
    return list(values) if isinstance(values, list) else None


def _version(value: Any) -> int | None:
    """A weights version as engines number them (an integer); None when the upstream names none, or
    names it some other way (its age is then unknown)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


class BadEventError(ValueError):
    """An upstream stream event whose data is not a JSON object; the message says so."""


class SseParser:
    """Splits a server-sent event byte stream into the JSON payloads of its ``data:`` lines."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[JsonDict]:
        """The complete events in ``chunk`` (and what was buffered); ``[DONE]`` is skipped.
        BadEventError when an event's data is not a JSON object (invalid JSON, a list, a number)."""
        buffer = self._buffer + chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *events, self._buffer = buffer.split(b"\n\n")
        payloads = []
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    data = line[5:].strip()
                    if data and data != b"[DONE]":
                        payloads.append(_object(data))
        return payloads


def _object(data: bytes) -> JsonDict:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise BadEventError(f"the upstream sent an event that is not JSON ({error})") from None
    if not isinstance(payload, dict):
        shown = data[:200].decode("utf-8", "replace")
        raise BadEventError(f"the upstream sent an event that is not a JSON object: {shown}")
    return payload


@dataclass
class _ChoiceState:
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, JsonDict] = field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    model_version: int | None = None


class StreamAccumulator:
    """Rebuilds each choice of a streamed response from its chunks, token ids included."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._choices: dict[int, _ChoiceState] = {}
        self._prompt_token_ids: list[int] | None = None
        self._head: JsonDict = {}
        self.usage: JsonDict | None = None
        self.error: Any = None

    def add(self, chunk: JsonDict) -> None:
        if not self._head:
            self._head = {"id": chunk.get("id"), "model": chunk.get("model")}
        if chunk.get("error"):
            self.error = chunk["error"]
        if chunk.get("prompt_token_ids") is not None:
            self._prompt_token_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            self._add_choice(chunk, choice)

    def _add_choice(self, chunk: JsonDict, choice: JsonDict) -> None:
        state = self._choices.setdefault(choice.get("index", 0), _ChoiceState())
        if self.endpoint == "chat":
            _add_delta(state, choice.get("delta") or {})
        elif choice.get("text"):
            state.content.append(choice["text"])
        if choice.get("prompt_token_ids") is not None:
            state.prompt_token_ids = choice["prompt_token_ids"]
        if choice.get("token_ids") is not None:
            state.token_ids = (state.token_ids or []) + choice["token_ids"]
        logprobs = _logprobs(self.endpoint, choice.get("logprobs"))
        if logprobs is not None:
            state.logprobs = (state.logprobs or []) + logprobs
        if choice.get("finish_reason"):
            state.finish_reason = choice["finish_reason"]
        version = choice.get("model_version", chunk.get("model_version"))
        if _version(version) is not None:
            state.model_version = _version(version)

    def records(self) -> list[ChoiceRecord]:
        return [self._record(index, state) for index, state in sorted(self._choices.items())]

    def _record(self, index: int, state: _ChoiceState) -> ChoiceRecord:
        text = "".join(state.content)
        response: JsonDict = {**self._head, "index": index}
        if self.endpoint == "chat":
            message: JsonDict = {"role": "assistant", "content": text or None}
            if state.tool_calls:
                message["tool_calls"] = [state.tool_calls[k] for k in sorted(state.tool_calls)]
            response["message"] = message
        else:
            response["text"] = text
        response.update(finish_reason=state.finish_reason, usage=self.usage)
        prompt_ids = state.prompt_token_ids if self.endpoint == "completions" else self._prompt_token_ids
        return ChoiceRecord(prompt_ids, state.token_ids, state.logprobs, response, state.model_version)


def _add_delta(state: _ChoiceState, delta: JsonDict) -> None:
    if delta.get("content"):
        state.content.append(delta["content"])
    for call in delta.get("tool_calls") or []:
        slot = state.tool_calls.setdefault(
            call.get("index", 0),
            {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
        )
        if call.get("id"):
            slot["id"] = call["id"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["function"]["name"] = function["name"]
        if function.get("arguments"):
            slot["function"]["arguments"] += function["arguments"]
