"""The recorder: spans per choice, error calls, stores that refuse or fail."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import pytest

from fulgor import semconv
from fulgor.gateway.recorder import CallRecord, Recorder
from fulgor.store.memory import MemoryStore
from fulgor.types import ModelCall, RolloutRequest, Span


def chat_body(*choices: list[int]) -> bytes:
    return json.dumps(
        {
            "prompt_token_ids": [1, 2],
            "choices": [
                {"index": i, "message": {"content": "x"}, "token_ids": ids} for i, ids in enumerate(choices)
            ],
        }
    ).encode()


def record(body: bytes | None, status: int = 200, error: str | None = None) -> CallRecord:
    return CallRecord("r", "a", "chat", {"messages": []}, time.time(), status=status, body=body, error=error)


def test_one_span_per_choice() -> None:
    spans = Recorder(MemoryStore()).spans_for(record(chat_body([3], [4, 5])))
    calls = [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]
    assert [c.response_token_ids for c in calls] == [[3], [4, 5]]
    assert all(s.name == semconv.SPAN_MODEL_CALL for s in spans)
    assert spans[0].resource[semconv.RESOURCE_ROLLOUT_ID] == "r"


def test_an_upstream_error_is_recorded_as_an_error_call() -> None:
    [span] = Recorder(MemoryStore()).spans_for(record(b'{"error": "boom"}', status=500))
    call = ModelCall.model_validate(span.attributes[semconv.ATTR_MODEL_CALL])
    assert call.error is not None
    assert "500" in call.error
    assert span.status.code == "error"


class FlakyStore(MemoryStore):
    """Fails the first ``failures`` writes with a connection error, refuses unknown rollouts."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store unreachable")
        return await super().add_spans(spans)


async def test_transient_store_failures_are_retried_and_refusals_counted_as_dropped() -> None:
    store = FlakyStore(failures=2)
    rollout = await store.start_rollout(RolloutRequest(input=1), worker_id="w")
    recorder = Recorder(store, linger_seconds=0)
    recorder.start()
    good = record(chat_body([3]))
    good.rollout_id, good.attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    for item in (good, record(chat_body([4]))):
        await recorder.reserve()
        recorder.submit(item)
    await recorder.flushed()
    assert recorder.stats.written == 1
    assert recorder.stats.dropped == 1
    assert recorder.stats.store_retries >= 1
    assert len(await store.query_spans(rollout.rollout_id)) == 1
    await recorder.close()


async def test_a_span_the_store_refuses_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    recorder = Recorder(store, linger_seconds=0)
    recorder.start()
    await recorder.reserve()
    recorder.submit(record(chat_body([1])))
    await recorder.flushed()
    assert recorder.stats.dropped == 1
    assert "refused a model call span of rollout r attempt a (not_found" in caplog.text
    await recorder.close()
