"""``ChangeSignal``: how store waits (claim, wait) sleep until the store changes."""

from __future__ import annotations

import asyncio

import pytest

from fulgor.store._rules import ChangeSignal


async def test_a_cancellation_arriving_with_a_change_is_not_lost() -> None:
    # A Ctrl+C (task cancellation) landing in the same loop turn as a change must still cancel the
    # waiter; otherwise the caller's loop (a claim or wait) goes on waiting.
    signal = ChangeSignal()
    waiter = asyncio.create_task(signal.wait(signal.version, 10))
    await asyncio.sleep(0)  # the waiter is asleep
    signal.notify()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_change_or_the_timeout_ends_the_wait() -> None:
    signal = ChangeSignal()
    waiter = asyncio.create_task(signal.wait(signal.version, 10))
    await asyncio.sleep(0)
    signal.notify()
    await asyncio.wait_for(waiter, 2)
    await asyncio.wait_for(signal.wait(signal.version, 0.01), 2)  # nothing changes: the timeout ends it
    await signal.wait(signal.version - 1, 10)  # already moved past: returns at once
