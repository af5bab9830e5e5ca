"""What the engine's unit and integration tests share: a tool definition, and a wait for the
generation thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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


async def until(condition: Callable[[], bool], timeout_seconds: float = 30.0) -> None:
    """Wait for a state change on the engine's generation thread, which offers no event to await."""
    for _ in range(int(timeout_seconds / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")
