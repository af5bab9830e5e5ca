"""A step's rollouts collecting in the background, so that step N+1's can run while step N trains.

``Collector.start(step, resources)`` begins collecting step ``step``'s rollouts (one collection at
a time); ``take(step, resources)`` waits for that step's rollouts, starting the collection first
when none was started ahead, and returns them with the step's timer, whose ``collect_rollouts`` is
the collection's own duration (which, collected ahead, overlapped the previous step). Leaving the
``async with`` block cancels a collection still running, which cancels the rollouts it enqueued
that have not ended (:func:`~fulgor.training.rollouts.run_rollouts`).

What it does not know: what collecting means (the trainer hands it a function) or when to
collect ahead (the algorithm's ``async_rollouts``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, TypeVar

from fulgor.training.reports import PhaseTimer
from fulgor.types import Rollout

__all__ = ["Collector"]

logger = logging.getLogger(__name__)

R = TypeVar("R")


class Collector(Generic[R]):
    """At most one step's rollouts being collected; ``R`` is the resources the trainer passes."""

    def __init__(self, collect: Callable[[int, R], Awaitable[list[Rollout]]]) -> None:
        self._collect = collect
        self._running: tuple[int, PhaseTimer, asyncio.Task[list[Rollout]]] | None = None

    def start(self, step: int, resources: R) -> None:
        """Begin collecting ``step``'s rollouts now, with ``resources``."""
        if self._running is not None:
            raise RuntimeError(f"step {self._running[0]}'s rollouts are still being collected")
        timer = PhaseTimer()

        async def collect() -> list[Rollout]:
            with timer("collect_rollouts"):
                return await self._collect(step, resources)

        self._running = (step, timer, asyncio.create_task(collect(), name=f"fulgor-collect-step-{step}"))

    async def take(self, step: int, resources: R) -> tuple[list[Rollout], PhaseTimer]:
        """``step``'s rollouts, once all have ended, and the step's timer."""
        if self._running is None:
            self.start(step, resources)
        assert self._running is not None
        started, timer, task = self._running
        if started != step:
            raise RuntimeError(f"step {step}'s rollouts were asked for, but step {started}'s are collecting")
        try:
            return await task, timer
        finally:
            if task.done():
                self._running = None

    async def __aenter__(self) -> Collector[R]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._running is None:
            return
        step, _, task = self._running
        self._running = None
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:  # the block's own error, if any, is the one that goes on
            logger.exception("collecting step %d's rollouts failed as well", step)
