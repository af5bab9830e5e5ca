"""Spans from the agent's own OpenTelemetry instrumentation land under its rollout."""

from __future__ import annotations

import asyncio
import os

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode, Tracer

from fulgor.agent import RolloutContext, use_context
from fulgor.agent.otel import install
from fulgor.store import MemoryStore
from fulgor.store.writer import SpanWriter
from fulgor.types import RolloutRequest


async def test_otel_spans_inside_a_rollout_are_stored_with_parents() -> None:
    store = MemoryStore()
    provider = TracerProvider()
    assert install(provider) is install(provider)
    tracer = provider.get_tracer("agent")
    await store.enqueue([RolloutRequest(input=1)])
    [claimed] = await store.claim("w")

    with tracer.start_as_current_span("outside"):
        pass
    recorder = SpanWriter(store)
    context = RolloutContext(claimed.rollout_id, claimed.attempt.attempt_id, recorder)
    attributes = {"step": 1, "tags": ("a", "b")}
    with use_context(context), tracer.start_as_current_span("agent.plan", attributes=attributes) as plan:
        plan.add_event("thought", {"text": "use the calculator"})
        await asyncio.to_thread(lambda: tracer.start_span("tool.call").end())
        with tracer.start_as_current_span("llm.call") as call:
            call.set_status(Status(StatusCode.ERROR, "rate limited"))
    await recorder.flush()

    spans = {span.name: span for span in await store.query_spans(claimed.rollout_id)}
    assert sorted(spans) == ["agent.plan", "llm.call", "tool.call"]
    plan_span, call_span = spans["agent.plan"], spans["llm.call"]
    assert call_span.parent_id == plan_span.span_id
    assert call_span.trace_id == plan_span.trace_id
    assert plan_span.parent_id is None
    assert plan_span.attributes == {"step": 1, "tags": ["a", "b"]}
    assert plan_span.events[0].attributes == {"text": "use the calculator"}
    assert call_span.status.code == "error"
    assert call_span.status.message == "rate limited"
    assert plan_span.end_time is not None
    assert plan_span.start_time <= call_span.start_time <= plan_span.end_time
    assert "service.name" in plan_span.resource
    await store.close()


async def a_rollout_with_a_tracer() -> tuple[MemoryStore, Tracer, SpanWriter, RolloutContext]:
    """A store with one claimed rollout, an installed tracer, and the rollout's recording context."""
    store = MemoryStore()
    provider = TracerProvider()
    install(provider)
    await store.enqueue([RolloutRequest(input=1)])
    [claimed] = await store.claim("w")
    recorder = SpanWriter(store)
    context = RolloutContext(claimed.rollout_id, claimed.attempt.attempt_id, recorder)
    return store, provider.get_tracer("agent"), recorder, context


async def test_non_finite_attribute_values_are_kept_as_otlp_writes_them() -> None:
    """NaN and infinities are legal OpenTelemetry values but not JSON: they are stored as the strings
    OTLP/JSON uses (as the OTLP endpoint stores them), not refused with the whole span."""
    store, tracer, recorder, context = await a_rollout_with_a_tracer()
    attributes = {"loss": float("nan"), "bounds": (float("-inf"), 1.5, float("inf"))}
    with use_context(context), tracer.start_as_current_span("agent.step", attributes=attributes):
        pass
    await recorder.flush()
    [span] = await store.query_spans(context.rollout_id)
    assert span.attributes == {"loss": "NaN", "bounds": ["-Infinity", 1.5, "Infinity"]}
    assert recorder.stats.lost == 0
    await store.close()


async def test_a_span_fulgor_cannot_store_never_raises_into_the_agent() -> None:
    """The SDK calls the bridge from span.end() unguarded: a name over the store's 512-character
    limit is cut to it, and a span that cannot be converted at all is counted as lost."""
    store, tracer, recorder, context = await a_rollout_with_a_tracer()
    with use_context(context):
        tracer.start_span("x" * 600).end()
        tracer.start_span("").end()  # an empty name is no valid span name
        tracer.start_span("after").end()
    await recorder.flush()
    names = [span.name for span in await store.query_spans(context.rollout_id)]
    assert names == ["x" * 512, "after"]
    assert (recorder.stats.lost, recorder.lost_for(context.rollout_id)) == (1, 1)
    await store.close()


def test_langchain_is_instrumented_without_prompts_in_its_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.instrumentation.langchain")
    import langchain_core  # noqa: F401  (an agent that uses LangChain has imported it)

    from fulgor.agent.otel import instrument_langchain

    monkeypatch.delenv("TRACELOOP_TRACE_CONTENT", raising=False)
    assert instrument_langchain()
    assert os.environ["TRACELOOP_TRACE_CONTENT"] == "false"  # the gateway records each call whole
    monkeypatch.setenv("TRACELOOP_TRACE_CONTENT", "true")
    assert instrument_langchain()  # once is enough; a setting of the user's stays
    assert os.environ["TRACELOOP_TRACE_CONTENT"] == "true"
