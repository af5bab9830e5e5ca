"""Tool calls in model output, in each model family's own format, under vLLM's parser names.

A parser turns the text a model generated into content and OpenAI ``tool_calls``:

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes, Qwen2.5,
  Qwen3, fulgor's own models), each block holding one object or a list of them (SmolLM2);
- ``llama3_json``: a JSON object ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``), with or
  without ``<|python_tag|>`` before it, several separated by ``;`` (Llama 3.1 to 3.3);
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of calls, or ``name[ARGS]{...}`` per call (newer
  Mistral tokenizers);
- ``pythonic``: a Python list of calls, ``[add(a=1, b=2), now()]`` (Llama 3.2 and 4, Gemma 3 with
  a pythonic tool template), with or without ``<|python_start|>`` / ``<|python_end|>`` around it.

Parsing is all or nothing: when every call the parser finds is well formed (a non-empty string name,
arguments that are an object), they come back with the text around them as content; otherwise the
whole output is returned as plain content. A model in training writes broken calls all the time,
and a broken call is a lesson (a reward of zero), never a crash.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from fulgor.engine.template import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from fulgor.errors import ConfigError

__all__ = [
    "TOOL_PARSERS",
    "ParsedOutput",
    "ToolCall",
    "ToolParser",
    "parse_tool_calls",
    "tool_arguments_for_template",
    "tool_parser",
]


@dataclass(frozen=True)
class ToolCall:
    """One parsed call; ``arguments`` is a JSON string as in the OpenAI API."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedOutput:
    """Model output split into content, tool calls and, with a reasoning parser, the reasoning."""

    content: str | None
    tool_calls: list[ToolCall]
    reasoning_content: str | None = None


ToolParser = Callable[[str], ParsedOutput]


def _plain(text: str) -> ParsedOutput:
    return ParsedOutput(content=text, tool_calls=[])


def _call(payload: Any, arguments_keys: tuple[str, ...] = ("arguments",)) -> ToolCall | None:
    """A call from ``{"name": ..., "arguments": {...}}`` (arguments may be a JSON string), or None."""
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    arguments: Any = {}
    for key in arguments_keys:
        if key in payload:
            arguments = payload[key]
            break
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(
        id=f"call_{secrets.token_hex(12)}", name=name, arguments=json.dumps(arguments, ensure_ascii=False)
    )


def _calls(payloads: list[Any], arguments_keys: tuple[str, ...] = ("arguments",)) -> list[ToolCall] | None:
    """Every payload as a call, or None when any one is not a well-formed call (or there are none)."""
    calls = [_call(payload, arguments_keys) for payload in payloads]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


_HERMES_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def parse_tool_calls(text: str) -> ParsedOutput:
    """The ``hermes`` parser: ``<tool_call>`` blocks of one object or a list of objects each."""
    if TOOL_CALL_OPEN not in text:
        return _plain(text)
    blocks = list(_HERMES_BLOCK.finditer(text))
    remainder = _HERMES_BLOCK.sub("", text)
    if not blocks or TOOL_CALL_OPEN in remainder or TOOL_CALL_CLOSE in remainder:
        return _plain(text)
    payloads: list[Any] = []
    for match in blocks:
        payload = _json(match.group(1))
        if isinstance(payload, list) and payload:
            payloads.extend(payload)
        else:
            payloads.append(payload)
    calls = _calls(payloads)
    if calls is None:
        return _plain(text)
    return ParsedOutput(content=remainder.strip() or None, tool_calls=calls)


_PYTHON_TAG: Final = "<|python_tag|>"


def _parse_llama3_json(text: str) -> ParsedOutput:
    """``{"name": ..., "parameters": {...}}`` objects, the first at the start of the output (after
    ``<|python_tag|>`` if any), several separated by ``;``; text before the first call is content."""
    stripped = text.strip()
    tagged = _PYTHON_TAG in stripped
    content, _, body = stripped.partition(_PYTHON_TAG) if tagged else ("", "", stripped)
    body = body.strip()
    if not body.startswith("{"):
        return _plain(text)
    decoder = json.JSONDecoder()
    payloads: list[Any] = []
    position = 0
    while position < len(body):
        try:
            payload, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return _plain(text)
        payloads.append(payload)
        position = end
        rest = body[position:].lstrip()
        if not rest:
            break
        if not rest.startswith(";"):
            return _plain(text)
        position = len(body) - len(rest) + 1
        while position < len(body) and body[position].isspace():
            position += 1
    calls = _calls(payloads, ("parameters", "arguments"))
    if calls is None:
        return _plain(text)
    return ParsedOutput(content=content.strip() or None, tool_calls=calls)


_TOOL_CALLS: Final = "[TOOL_CALLS]"
_ARGS: Final = "[ARGS]"
_CALL_ID: Final = "[CALL_ID]"


def _parse_mistral(text: str) -> ParsedOutput:
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` or ``[TOOL_CALLS]name[ARGS]{...}``
    (one marker per call, optionally ``name[CALL_ID]id[ARGS]{...}``); text before is content."""
    if _TOOL_CALLS not in text:
        return _plain(text)
    content, *segments = text.split(_TOOL_CALLS)
    payloads: list[Any] = []
    for segment in segments:
        segment = segment.strip()
        if segment.startswith("["):
            listed = _json(segment)
            if not isinstance(listed, list) or not listed:
                return _plain(text)
            payloads.extend(listed)
            continue
        name, found, arguments = segment.partition(_ARGS)
        if not found:
            return _plain(text)
        name = name.partition(_CALL_ID)[0].strip()
        payloads.append({"name": name, "arguments": _json(arguments.strip())})
    calls = _calls(payloads)
    if calls is None:
        return _plain(text)
    return ParsedOutput(content=content.strip() or None, tool_calls=calls)


_NAMED: Final = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    """A JSON value written as a Python literal (JSON's ``true``, ``false`` and ``null`` too, which
    templates that write arguments with ``tojson`` produce); ValueError for anything else."""
    if isinstance(node, ast.Name) and node.id in _NAMED:
        return _NAMED[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        keys = [ast.literal_eval(key) if key is not None else None for key in node.keys]
        if not all(isinstance(key, str) for key in keys):
            raise ValueError("object keys must be strings")
        return {key: _literal(item) for key, item in zip(keys, node.values, strict=True)}
    value = ast.literal_eval(node)
    if not isinstance(value, str | int | float | bool) and value is not None:
        raise ValueError(f"{type(value).__name__} is not a JSON value")
    return value


def _parse_pythonic(text: str) -> ParsedOutput:
    """The whole output is a Python list of calls with keyword arguments of literal values."""
    body = text.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
    if not (body.startswith("[") and body.endswith("]")):
        return _plain(text)
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError):
        return _plain(text)
    if not isinstance(tree, ast.List) or not tree.elts:
        return _plain(text)
    payloads: list[Any] = []
    for element in tree.elts:
        if not isinstance(element, ast.Call) or not isinstance(element.func, ast.Name) or element.args:
            return _plain(text)
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in element.keywords if kw.arg is not None}
        except (ValueError, TypeError, SyntaxError):
            return _plain(text)
        if len(arguments) != len(element.keywords):  # **kwargs
            return _plain(text)
        payloads.append({"name": element.func.id, "arguments": arguments})
    calls = _calls(payloads)
    if calls is None:
        return _plain(text)
    return ParsedOutput(content=None, tool_calls=calls)


TOOL_PARSERS: Final[dict[str, ToolParser]] = {
    "hermes": parse_tool_calls,
    "llama3_json": _parse_llama3_json,
    "mistral": _parse_mistral,
    "pythonic": _parse_pythonic,
}
"""Each parser by the name vLLM's ``--tool-call-parser`` gives the same format."""


def tool_parser(name: str) -> ToolParser:
    """The parser called ``name``, or a ConfigError that lists them."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ConfigError(
            f"no tool-call parser is called {name!r}; choose one of {', '.join(sorted(TOOL_PARSERS))}"
        ) from None


def tool_arguments_for_template(arguments: Any) -> Any:
    """Chat templates expect arguments as a mapping; the OpenAI API sends a JSON string.

    A string that is not a JSON object is passed through unchanged, and the template renders it as is.
    """
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments
