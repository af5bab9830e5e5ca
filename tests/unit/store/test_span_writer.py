"""The one span writer against real stores whose writes fail: retried, or lost loudly, never silently."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from fulgor import semconv
from fulgor.agent import RolloutContext, emit_message, emit_reward, use_context
from fulgor.errors import ConfigError, StoreUnavailableError
from fulgor.store import MemoryStore, SqliteStore, Store
from fulgor.store.writer import SpanWriter
from fulgor.types import AttemptedRollout, RolloutRequest, Span


class FailingWrites:
    """Makes ``store.add_spans`` raise ``error`` for the next ``failures`` calls (or block on ``gate``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.real = store.add_spans
        self.failures = 0
        self.error: Exception = StoreUnavailableError("the store is briefly unreachable")
        self.gate: asyncio.Event | None = None
        self.calls = 0
        self.batches: list[int] = []
        self.called = asyncio.Event()
        store.add_spans = self.add_spans  # type: ignore[method-assign]

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        self.calls += 1
        self.batches.append(len(spans))
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise self.error
        return await self.real(spans)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    store: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "store.sqlite")
    yield store
    await store.close()


@pytest.fixture
async def claimed(store: Store) -> AttemptedRollout:
    await store.enqueue([RolloutRequest(input={})])
    [claimed] = await store.claim("w")
    return claimed


def context_for(claimed: AttemptedRollout, writer: SpanWriter) -> RolloutContext:
    return RolloutContext(claimed.rollout_id, claimed.attempt.attempt_id, writer)


def bad_span(claimed: AttemptedRollout) -> Span:
    return Span(
        rollout_id=claimed.rollout_id,
        attempt_id=claimed.attempt.attempt_id,
        trace_id="t",
        span_id="bad",
        name="agent.step",
        start_time=0.0,
        attributes={"score": float("nan")},  # not JSON: every store refuses it
    )


async def test_the_writer_retries_a_store_that_is_away_and_keeps_going(
    store: Store, claimed: AttemptedRollout
) -> None:
    writes = FailingWrites(store)
    writes.failures = 2
    writer = SpanWriter(store, backoff_seconds=0.01)
    writer.start()
    with use_context(context_for(claimed, writer)):
        emit_reward(1.0)
        await writer.flush()  # written while the agent is still running
        assert writer.stats.written == 1
        emit_message("after the failure")
        await writer.flush()
    await writer.close()
    assert (writer.stats.written, writer.stats.lost, writer.stats.retries, writes.calls) == (2, 0, 2, 4)
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == [semconv.SPAN_REWARD, semconv.SPAN_MESSAGE]


async def test_a_store_away_past_the_retry_window_loses_spans_loudly_and_counts_them(
    store: Store, claimed: AttemptedRollout, caplog: pytest.LogCaptureFixture
) -> None:
    writes = FailingWrites(store)
    writes.failures = 1_000
    writer = SpanWriter(store, retry_seconds=0.1, backoff_seconds=0.01)
    writer.start()
    with use_context(context_for(claimed, writer)):
        emit_message("one")
        emit_message("two")
    await writer.flush()
    assert (writer.stats.written, writer.stats.lost, writer.pending) == (0, 2, 0)
    assert writer.lost_for(claimed.rollout_id) == 2
    assert f"2 span(s) of rollout {claimed.rollout_id} attempt {claimed.attempt.attempt_id}" in caplog.text
    assert "counted in spans_lost" in caplog.text
    writes.failures = 0  # the store is back: what comes next is written
    with use_context(context_for(claimed, writer)):
        emit_message("three")
    await writer.close()
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.attributes[semconv.ATTR_MESSAGE_BODY] for s in spans] == ["three"]


async def test_one_outage_clock_for_every_batch(store: Store, claimed: AttemptedRollout) -> None:
    """Once the store has been away for retry_seconds, each batch still waiting gets one try: closing
    a writer with many batches never waits one retry window per batch."""
    writes = FailingWrites(store)
    writes.failures = 1_000
    writer = SpanWriter(store, batch_size=1, retry_seconds=0.1, backoff_seconds=0.01)
    with use_context(context_for(claimed, writer)):
        for i in range(10):
            emit_message(str(i))
    await writer.close()
    first_batch_tries = writes.calls - 9
    assert writer.stats.lost == 10
    assert 2 <= first_batch_tries < 10  # backoff 0.01, 0.02, 0.04 within 0.1 s, then one try each


async def test_a_span_the_store_refuses_is_lost_alone(store: Store, claimed: AttemptedRollout) -> None:
    """One invalid span must not hold back the rest of the trace (the reward included): the batch
    is written span by span, the refused one counted as lost, and nothing is retried."""
    writes = FailingWrites(store)
    writer = SpanWriter(store)
    with use_context(context_for(claimed, writer)) as context:
        emit_message("before")
        context.record(bad_span(claimed))
        emit_reward(1.0)
    await writer.close()
    assert (writer.stats.written, writer.stats.lost, writer.pending, writer.stats.retries) == (2, 1, 0, 0)
    assert writes.batches == [3, 1, 1, 1]  # the batch, then its three spans one by one
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == [semconv.SPAN_MESSAGE, semconv.SPAN_REWARD]


async def test_a_write_cancelled_midway_puts_its_batch_back(store: Store, claimed: AttemptedRollout) -> None:
    writes = FailingWrites(store)
    writes.gate = asyncio.Event()
    writer = SpanWriter(store)
    writer.start()
    with use_context(context_for(claimed, writer)):
        emit_reward(1.0)
    await asyncio.wait_for(writes.called.wait(), timeout=5)
    task = writer._task
    assert task is not None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert writer.pending == 1
    writes.gate.set()
    writer._task = None  # as if never started: flushing writes in the caller's task
    await writer.flush()
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == [semconv.SPAN_REWARD]


async def test_spans_added_from_another_thread_are_written(store: Store, claimed: AttemptedRollout) -> None:
    writer = SpanWriter(store)
    writer.start()
    context = context_for(claimed, writer)

    def in_a_thread() -> None:
        with use_context(context):
            emit_message("from a thread")

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    await writer.close()
    assert [s.name for s in await store.query_spans(claimed.rollout_id)] == [semconv.SPAN_MESSAGE]


async def test_put_waits_while_the_writer_holds_max_pending_spans(
    store: Store, claimed: AttemptedRollout
) -> None:
    writes = FailingWrites(store)
    writes.gate = asyncio.Event()
    writer = SpanWriter(store, batch_size=1, max_pending=1)
    writer.start()
    with use_context(context_for(claimed, writer)):
        emit_message("first")
    await asyncio.wait_for(writes.called.wait(), timeout=5)
    second = asyncio.ensure_future(writer.put([bad_span(claimed).model_copy(update={"attributes": {}})]))
    await asyncio.sleep(0.05)
    assert not second.done()  # the store is stuck: the caller waits instead of memory growing
    writes.gate.set()
    await asyncio.wait_for(second, timeout=5)
    await writer.close()
    assert writer.stats.written == 2


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        SpanWriter(MemoryStore(), batch_size=0)
    with pytest.raises(ConfigError, match="retry"):
        SpanWriter(MemoryStore(), retry_seconds=-1)
