"""Agents that the runner-process tests import by module:object."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from fulgor import SubprocessAgent, emit_message, rollout


@rollout
async def sleeper(task: dict[str, Any]) -> float:
    emit_message(f"pid {os.getpid()} sleeping {task['seconds']}s")
    await asyncio.sleep(task["seconds"])
    return 1.0


@rollout
async def dies_first_time(task: dict[str, Any], rollout: Any) -> float:
    """Hangs on a rollout's first attempt (the test kills its process), finishes on the retry."""
    emit_message(f"attempt {rollout.attempt.sequence_id} in pid {os.getpid()}")
    if rollout.attempt.sequence_id == 1:
        await asyncio.sleep(600)
    return 1.0


@rollout
async def kills_its_runner_first_time(task: dict[str, Any], rollout: Any) -> float:
    """On a rollout's first attempt the process running it dies (a runner killed mid-rollout, an
    out-of-memory kill); the retry finishes."""
    if rollout.attempt.sequence_id == 1:
        os._exit(17)
    emit_message(f"attempt {rollout.attempt.sequence_id} in pid {os.getpid()}")
    return 1.0


# A zero-code agent: a program in a session of its own that sleeps task["seconds"].
sleeping_program = SubprocessAgent(
    [
        sys.executable,
        "-c",
        "import json, os, time; time.sleep(json.loads(os.environ['FULGOR_TASK'])['seconds'])",
    ]
)
