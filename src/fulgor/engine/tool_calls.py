"""Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in model output.

Parsing is all or nothing: when every ``<tool_call>`` block holds a JSON object with a string
``name`` and object ``arguments``, the calls come back as OpenAI ``tool_calls`` and the text around
them as content; otherwise the whole output is returned as plain content. A model in training
writes broken calls all the time, and a broken call is a lesson (a reward of zero), never a crash.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from fulgor.engine.template import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

__all__ = ["ParsedOutput", "ToolCall", "parse_tool_calls", "tool_arguments_for_template"]

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


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
    """Model output split into content and tool calls."""

    content: str | None
    tool_calls: list[ToolCall]


def _parse_block(body: str) -> ToolCall | None:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    call_id = f"call_{secrets.token_hex(12)}"
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split ``text`` into content and tool calls; malformed calls leave the text as plain content."""
    if TOOL_CALL_OPEN not in text:
        return ParsedOutput(content=text, tool_calls=[])
    blocks = list(_BLOCK.finditer(text))
    remainder = _BLOCK.sub("", text)
    if not blocks or TOOL_CALL_OPEN in remainder or TOOL_CALL_CLOSE in remainder:
        return ParsedOutput(content=text, tool_calls=[])
    calls = [_parse_block(match.group(1)) for match in blocks]
    if any(call is None for call in calls):
        return ParsedOutput(content=text, tool_calls=[])
    content = remainder.strip()
    return ParsedOutput(content=content or None, tool_calls=[call for call in calls if call is not None])


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
