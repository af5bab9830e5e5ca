"""Agents that the runner-process tests import by module:object."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fulgor import emit_message, rollout


@rollout
async def sleeper(task: dict[str, Any]) -> float:
    emit_message(f"pid {os.getpid()} sleeping {task['seconds']}s")
    await asyncio.sleep(task["seconds"])
    return 1.0
