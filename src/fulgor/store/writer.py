"""SpanWriter: every span fulgor records reaches the store through one batched writer, one policy.

The gateway writes its ``fulgor.model_call`` spans with one, and every rollout a runner runs
writes its agent's spans (rewards, messages, operations, OpenTelemetry spans) with its own.

``add`` never blocks and never talks to the store: it may be called from any thread. A background
task (``start``) writes what has accumulated, up to ``batch_size`` spans per ``add_spans`` call,
after waiting up to ``linger_seconds`` for a batch to fill (a store that commits per write, such
as SQLite, then commits once for many spans even under light load). ``put`` is ``add`` for the
writer's own event loop that waits while more than ``max_pending`` spans are unwritten
(backpressure instead of growing memory).

The policy, the same for every span:

* A failure that may pass (:class:`~fulgor.errors.StoreUnavailableError`: a database down, a
  SQLite file locked past its timeout, a server unreachable; or an unexpected exception) is
  retried with backoff (``backoff_seconds`` doubled after each try, at most
  ``max_backoff_seconds``) until the store has been away for ``retry_seconds``; after that, each
  batch still waiting gets one more try. Retrying is safe: the store keeps one span per span id.
* A batch the store refuses (any other fulgor error: an invalid span, an unknown attempt, a body
  too large) is written span by span, so one bad span cannot hold back the others.
* A span that could not be written in the end is lost, and never silently: it is logged with its
  rollout and attempt and counted, in total (``stats.lost``) and per rollout (:meth:`lost_for`);
  the runner records a rollout's count in its attempt's metadata (``spans_lost``) and the trainer
  shows it in the drift report. :meth:`count_lost` counts spans lost before they reached the
  writer (an OpenTelemetry span that could not be converted).

``flush`` waits until every span added before it is written or lost; ``close`` flushes, then stops.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fulgor.errors import ConfigError, FulgorError, StoreUnavailableError
from fulgor.store.base import Store
from fulgor.types import Span

__all__ = ["SpanWriter", "SpanWriterStats", "WriterClosedError"]

logger = logging.getLogger(__name__)


class WriterClosedError(FulgorError):
    """Spans were added to a span writer that was closed (its rollout's attempt has ended)."""

    code = "writer_closed"


@dataclass
class SpanWriterStats:
    """``written``: spans the store took; ``lost``: spans it never got (each logged); ``retries``:
    writes tried again after a failure that may pass."""

    written: int = 0
    lost: int = 0
    retries: int = 0


class SpanWriter:
    """Batched, retried writes of spans to ``store``; see the module docstring."""

    def __init__(
        self,
        store: Store,
        *,
        batch_size: int = 256,
        linger_seconds: float = 0.0,
        max_pending: int = 100_000,
        retry_seconds: float = 30.0,
        backoff_seconds: float = 0.05,
        max_backoff_seconds: float = 2.0,
    ) -> None:
        if batch_size < 1 or max_pending < 1:
            raise ConfigError("a SpanWriter needs batch_size >= 1 and max_pending >= 1")
        if min(linger_seconds, retry_seconds, backoff_seconds, max_backoff_seconds) < 0:
            raise ConfigError("a SpanWriter's linger, retry and backoff seconds must be >= 0")
        self._store = store
        self.batch_size = batch_size
        self.linger_seconds = linger_seconds
        self.max_pending = max_pending
        self.retry_seconds = retry_seconds
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.stats = SpanWriterStats()
        self._lost_by_rollout: dict[str, int] = {}
        self._pending: list[Span] = []
        self._lock = threading.Lock()
        self._added = 0  # spans ever added; the writer has handled (written or lost) _handled of them
        self._handled = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._progress: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._outage_started: float | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Spans added that the store has not got yet (being written included)."""
        with self._lock:
            return self._added - self._handled

    def lost_for(self, rollout_id: str) -> int:
        """How many spans of ``rollout_id`` were lost (logged as they were)."""
        with self._lock:
            return self._lost_by_rollout.get(rollout_id, 0)

    def count_lost(self, rollout_id: str, count: int = 1) -> None:
        """Count spans of ``rollout_id`` lost before they reached the writer (from any thread)."""
        with self._lock:
            self.stats.lost += count
            self._lost_by_rollout[rollout_id] = self._lost_by_rollout.get(rollout_id, 0) + count

    # -- adding -----------------------------------------------------------------------------------

    def add(self, spans: Sequence[Span]) -> None:
        """Queue ``spans`` for writing, from any thread; returns at once. WriterClosedError once the
        writer is closed: nothing added then would ever be written."""
        if not spans:
            return
        with self._lock:
            if self._closed:
                raise WriterClosedError(f"this span writer is closed; {len(spans)} span(s) not taken")
            self._pending.extend(spans)
            self._added += len(spans)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def put(self, spans: Sequence[Span]) -> None:
        """``add``, after waiting (on the writer's loop) while ``max_pending`` spans are unwritten."""
        while self._task is not None and self.pending >= self.max_pending:
            await self._next_progress()
        self.add(spans)

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start writing in the background, on the running event loop."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._progress = asyncio.Event()
            self._task = self._loop.create_task(self._run(), name="fulgor-span-writer")

    async def flush(self) -> None:
        """Wait until every span added before this call is written or lost."""
        with self._lock:
            target = self._added
        if self._task is None:  # not started: write in the caller's task
            while self._handled < target:
                await self._write_next()
            return
        while self._handled < target:
            if self._task.done():
                self._task.result()  # the writer failed: say why
                return
            await self._next_progress()

    async def close(self) -> None:
        """Take no more spans, write (or lose, after the retries) everything added, then stop the
        background task."""
        with self._lock:
            self._closed = True
        await self.flush()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._loop = self._wake = None

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            if not self.pending:
                await self._wake.wait()
                self._wake.clear()
                continue
            if self.linger_seconds and self.pending < self.batch_size:
                await asyncio.sleep(self.linger_seconds)
            await self._write_next()

    async def _next_progress(self) -> None:
        assert self._progress is not None
        await self._progress.wait()

    def _advance(self, count: int) -> None:
        with self._lock:
            self._handled += count
        if self._progress is not None:  # wake every waiter once; each checks its own target again
            progress, self._progress = self._progress, asyncio.Event()
            progress.set()

    async def _write_next(self) -> None:
        """Take the next batch and write it with the policy; a cancelled write puts it back."""
        with self._lock:
            batch, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size :]
        try:
            await self._write(batch)
        except BaseException:
            with self._lock:
                self._pending[:0] = batch  # first in line again, to keep the order
            raise
        self._advance(len(batch))

    # -- the policy -------------------------------------------------------------------------------

    async def _write(self, batch: list[Span]) -> None:
        delay = self.backoff_seconds
        while True:
            try:
                await self._store.add_spans(batch)
            except StoreUnavailableError as failure:
                cause: BaseException = failure
            except FulgorError as refusal:
                if len(batch) == 1:
                    self._lose(batch, f"the store refused it ({refusal.code}: {refusal.message})")
                    return
                for span in batch:  # one by one, so that one bad span loses nothing else
                    await self._write([span])
                return
            except Exception as failure:  # a failure nobody classified: it may pass, so retry it too
                cause = failure
            else:
                self._outage_started = None
                with self._lock:
                    self.stats.written += len(batch)
                return
            # One clock per outage, not per batch: once the store has been away for retry_seconds,
            # each batch still waiting gets one try, so closing never waits an outage per batch.
            now = time.monotonic()
            if self._outage_started is None:
                self._outage_started = now
            if now + delay > self._outage_started + self.retry_seconds:
                self._lose(batch, f"the store could not be reached for {self.retry_seconds:g}s ({cause})")
                return
            self.stats.retries += 1
            logger.warning("writing %d span(s) failed (%s); retrying in %.2fs", len(batch), cause, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff_seconds)

    def _lose(self, spans: list[Span], why: str) -> None:
        groups: dict[tuple[str, str], list[Span]] = {}
        for span in spans:
            groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
        for (rollout_id, attempt_id), lost in groups.items():
            self.count_lost(rollout_id, len(lost))
            names = ", ".join(sorted({span.name for span in lost}))
            logger.error(
                "%d span(s) of rollout %s attempt %s were not stored (%s), counted in spans_lost: %s",
                len(lost),
                rollout_id,
                attempt_id,
                names,
                why,
            )
