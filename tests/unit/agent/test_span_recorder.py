"""The span recorder against real stores whose writes fail: nothing recorded is ever dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from fulgor import semconv
from fulgor.agent import RolloutContext, SpanRecorder, emit_message, emit_reward, use_context
from fulgor.errors import StoreError
from fulgor.store import MemoryStore, SqliteStore, Store
from fulgor.types import AttemptedRollout, RolloutRequest, Span


class FailingWrites:
    """Makes ``store.add_spans`` raise ``error`` for the next ``failures`` calls (or block on ``gate``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.real = store.add_spans
        self.failures = 0
        self.error: Exception = StoreError("the store is briefly unreachable")
        self.gate: asyncio.Event | None = None
        self.calls = 0
        self.called = asyncio.Event()
        store.add_spans = self.add_spans  # type: ignore[method-assign]

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        self.calls += 1
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


def context_for(claimed: AttemptedRollout, recorder: SpanRecorder) -> RolloutContext:
    return RolloutContext(claimed.rollout_id, claimed.attempt.attempt_id, recorder)


async def test_the_background_flusher_retries_a_failed_write_and_keeps_going(
    store: Store, claimed: AttemptedRollout
) -> None:
    writes = FailingWrites(store)
    writes.failures = 2
    recorder = SpanRecorder(store, retry_delay_seconds=0.01)
    flusher = asyncio.create_task(recorder.run())
    with use_context(context_for(claimed, recorder)):
        emit_reward(1.0)
        for _ in range(50):  # the flusher writes while the agent is still running
            if recorder.written:
                break
            await asyncio.sleep(0.02)
        assert recorder.written == 1
        emit_message("after the failure")
        for _ in range(50):
            if recorder.written == 2:
                break
            await asyncio.sleep(0.02)
    assert not flusher.done(), "the flusher died on a failed write"
    assert recorder.written == 2
    flusher.cancel()
    await recorder.flush()
    assert writes.calls == 4
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == [semconv.SPAN_REWARD, semconv.SPAN_MESSAGE]


async def test_a_write_that_keeps_failing_raises_and_loses_nothing(
    store: Store, claimed: AttemptedRollout
) -> None:
    writes = FailingWrites(store)
    writes.failures = 3
    recorder = SpanRecorder(store, write_tries=3, retry_delay_seconds=0.01)
    with use_context(context_for(claimed, recorder)):
        emit_message("one")
        emit_message("two")
    with pytest.raises(StoreError, match="briefly unreachable"):
        await recorder.flush()
    assert writes.calls == 3
    assert recorder.pending == 2
    with use_context(context_for(claimed, recorder)):
        emit_message("three")
    await recorder.flush()  # the store is back: everything goes, in the order it was recorded
    assert recorder.pending == 0
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.attributes[semconv.ATTR_MESSAGE_BODY] for s in spans] == ["one", "two", "three"]


async def test_a_span_the_store_refuses_is_dropped_alone(store: Store, claimed: AttemptedRollout) -> None:
    """One invalid span must not hold back the rest of the trace (the reward included): the batch
    is written span by span, the refused one dropped and counted, and nothing is retried."""
    writes = FailingWrites(store)
    recorder = SpanRecorder(store, retry_delay_seconds=0.01)
    bad = Span(
        rollout_id=claimed.rollout_id,
        attempt_id=claimed.attempt.attempt_id,
        trace_id="t",
        span_id="bad",
        name="agent.step",
        start_time=0.0,
        attributes={"score": float("nan")},  # not JSON: every store refuses it
    )
    with use_context(context_for(claimed, recorder)):
        emit_message("before")
        recorder.record(bad)
        emit_reward(1.0)
    await recorder.flush()
    assert (recorder.written, recorder.refused, recorder.pending) == (2, 1, 0)
    assert writes.calls == 4  # the batch, then its three spans one by one
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == [semconv.SPAN_MESSAGE, semconv.SPAN_REWARD]


async def test_a_write_cancelled_midway_puts_its_batch_back(store: Store, claimed: AttemptedRollout) -> None:
    writes = FailingWrites(store)
    writes.gate = asyncio.Event()
    recorder = SpanRecorder(store)
    flusher = asyncio.create_task(recorder.run())
    with use_context(context_for(claimed, recorder)):
        emit_reward(1.0)
    await asyncio.wait_for(writes.called.wait(), timeout=5)
    flusher.cancel()  # what the runner does when the agent returns
    await asyncio.gather(flusher, return_exceptions=True)
    assert recorder.pending == 1
    writes.gate.set()
    await recorder.flush()
    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == [semconv.SPAN_REWARD]


def test_bad_retry_settings_are_refused() -> None:
    from fulgor.agent import AgentError

    with pytest.raises(AgentError, match="write_tries"):
        SpanRecorder(MemoryStore(), write_tries=0)
