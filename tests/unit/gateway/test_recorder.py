"""The recorder: spans per choice, error calls, ids it cannot trust, stores that refuse or fail."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import pytest

from fulgor import semconv
from fulgor.gateway.recorder import CallRecord, Recorder
from fulgor.store.memory import MemoryStore
from fulgor.types import ModelCall, RolloutRequest, Span


def chat_body(*choices: list[int], completion_tokens: int | None = None) -> bytes:
    body: dict[str, object] = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {"index": i, "message": {"content": "x"}, "token_ids": ids} for i, ids in enumerate(choices)
        ],
    }
    if completion_tokens is not None:
        body["usage"] = {"prompt_tokens": 2, "completion_tokens": completion_tokens}
    return json.dumps(body).encode()


def sse(*payloads: object) -> list[bytes]:
    return [b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads] + [b"data: [DONE]\n\n"]


def calls_of(spans: list[Span]) -> list[ModelCall]:
    return [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]


def record(body: bytes | None, status: int = 200, error: str | None = None) -> CallRecord:
    return CallRecord("r", "a", "chat", {"messages": []}, time.time(), status=status, body=body, error=error)


def test_one_span_per_choice() -> None:
    spans = Recorder(MemoryStore()).spans_for(record(chat_body([3], [4, 5])))
    calls = [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]
    assert [c.response_token_ids for c in calls] == [[3], [4, 5]]
    assert all(s.name == semconv.SPAN_MODEL_CALL for s in spans)
    assert spans[0].resource[semconv.RESOURCE_ROLLOUT_ID] == "r"


def test_ids_that_disagree_with_the_usage_are_not_trusted() -> None:
    # vLLM issue #27482: a tool parser dropped ids and logprobs together, so only usage tells.
    recorder = Recorder(MemoryStore())
    [short] = calls_of(recorder.spans_for(record(chat_body([3, 4], completion_tokens=5))))
    assert short.token_ids_missing
    assert short.response_token_ids is None
    assert recorder.token_ids_missing == 1
    # n > 1: usage counts every choice together.
    calls = calls_of(recorder.spans_for(record(chat_body([3], [4, 5], completion_tokens=3))))
    assert [c.response_token_ids for c in calls] == [[3], [4, 5]]
    assert not any(c.token_ids_missing for c in calls)


def test_a_streamed_usage_mismatch_is_flagged_too() -> None:
    call = record(None)
    call.stream_chunks = sse(
        {"prompt_token_ids": [1], "choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [7]}]},
        {"choices": [{"index": 0, "delta": {}, "token_ids": [], "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4}},
    )
    [recorded] = calls_of(Recorder(MemoryStore()).spans_for(call))
    assert recorded.token_ids_missing
    assert recorded.response["finish_reason"] == "tool_calls"


def test_a_streamed_choice_without_a_finish_reason_is_an_error_without_ids() -> None:
    call = record(None)
    call.stream_chunks = sse(
        {"prompt_token_ids": [1], "choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [7]}]},
    )
    [span] = Recorder(MemoryStore()).spans_for(call)
    [recorded] = calls_of([span])
    assert recorded.error is not None
    assert "no finish_reason" in recorded.error
    assert recorded.response_token_ids is None
    assert span.status.code == "error"


def test_a_stream_that_carried_an_error_chunk_is_an_error() -> None:
    call = record(None)
    call.stream_chunks = sse(
        {"prompt_token_ids": [1], "choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [7]}]},
        {"error": {"message": "generation failed", "type": "server_error"}},
    )
    [recorded] = calls_of(Recorder(MemoryStore()).spans_for(call))
    assert recorded.error is not None
    assert "generation failed" in recorded.error
    assert recorded.response_token_ids is None


def test_a_stream_with_an_event_that_is_not_a_json_object_is_an_error() -> None:
    call = record(None)
    call.stream_chunks = sse(
        {"prompt_token_ids": [1], "choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [7]}]},
        [1, 2],
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    )
    [recorded] = calls_of(Recorder(MemoryStore()).spans_for(call))
    assert recorded.error is not None
    assert "not a JSON object: [1, 2]" in recorded.error
    assert recorded.response_token_ids is None


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


async def test_transient_store_failures_are_retried_and_refusals_counted_as_lost() -> None:
    store = FlakyStore(failures=2)
    rollout = await store.start_rollout(RolloutRequest(input=1), worker_id="w")
    recorder = Recorder(store, linger_seconds=0)
    recorder.start()
    good = record(chat_body([3]))
    good.rollout_id, good.attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    for item in (good, record(chat_body([4]))):
        await recorder.reserve()
        recorder.submit(item)
    await recorder.caught_up()
    assert recorder.writer.stats.written == 1
    assert recorder.writer.stats.lost == recorder.writer.lost_for("r") == 1
    assert recorder.writer.stats.retries >= 1
    assert len(await store.query_spans(rollout.rollout_id)) == 1
    await recorder.close()


async def test_a_span_the_store_refuses_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    recorder = Recorder(store, linger_seconds=0)
    recorder.start()
    await recorder.reserve()
    recorder.submit(record(chat_body([1])))
    await recorder.caught_up()
    assert recorder.writer.stats.lost == 1
    assert "1 span(s) of rollout r attempt a were not stored (fulgor.model_call)" in caplog.text
    assert "the store refused it (not_found" in caplog.text
    await recorder.close()
