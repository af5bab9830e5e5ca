"""A tool definition the engine's unit and integration tests share."""

from __future__ import annotations

from typing import Any

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}
