"""OpenTelemetry bridge: spans from the agent's own instrumentation land in the store.

An agent instrumented with OpenTelemetry (an OpenAI or LangChain instrumentation, or its own
``tracer.start_as_current_span``) keeps doing so; :func:`install` adds a span processor to the
tracer provider that records every span started inside a rollout under that rollout and attempt,
with its OpenTelemetry trace, span and parent ids kept. Spans started outside any rollout are
left alone, and so are spans started in a thread the agent started without carrying its context
(see :mod:`fulgor.agent.context`). The bridge never raises into the agent's ``span.end()``: a
name over the store's limit is cut to it, and a span that cannot be converted is logged and
counted in its rollout's ``spans_lost``. While a span of a rollout runs, the bridge also knows the
agent it runs in: the agent its own ``gen_ai.agent.name`` names (OpenTelemetry's GenAI semantic
conventions: AutoGen's ``invoke_agent`` spans start with it), else its parent's
(:func:`current_agent_name`). Only the attributes a span starts with are read: one set later (as
the LangChain instrumentation names a whole LangGraph graph) names no agent here.

:func:`instrument_langchain` turns on OpenTelemetry's LangChain instrumentation for an agent
written with LangChain or LangGraph: its spans name the LangGraph node each model call ran in, and
it sends that call's ``traceparent`` header, so the gateway's record of the call can be traced to
its node (:mod:`fulgor.adapters.agents`). Runners call it when the agent has imported LangChain.

Needs the ``opentelemetry-sdk`` package (``pip install 'fulgor[frameworks]'``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Literal

from fulgor.agent.context import AgentError, RolloutContext, _current
from fulgor.semconv import ATTR_GENAI_AGENT_NAME
from fulgor.store._rules import json_float
from fulgor.types import Span, SpanEvent, SpanStatus

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace import Span as SdkSpan

__all__ = ["current_agent_name", "install", "instrument_langchain"]

logger = logging.getLogger(__name__)

_NANOSECONDS = 1e9
_NAME_LIMIT = 512  # Span.name's max_length
_STATUS: dict[int, Literal["unset", "ok", "error"]] = {0: "unset", 1: "ok", 2: "error"}
_BRIDGE = "_fulgor_bridge"  # the provider's attribute holding the bridge's processor


def install(tracer_provider: TracerProvider | None = None) -> TracerProvider:
    """Record OpenTelemetry spans made inside rollouts; returns the provider it was added to.

    With no provider given it uses the global one, and sets a new SDK provider as the global one
    when none is set yet. Installing twice on one provider adds one processor only.
    """
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as error:
        raise AgentError(
            "the OpenTelemetry bridge needs opentelemetry-sdk: pip install 'fulgor[frameworks]'"
        ) from error
    provider = tracer_provider
    if provider is None:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            provider = current
        else:
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
    if getattr(provider, _BRIDGE, None) is None:
        processor = _processor()
        provider.add_span_processor(processor)
        setattr(provider, _BRIDGE, processor)
    return provider


def current_agent_name() -> str | None:
    """The agent the current OpenTelemetry span of a rollout runs in (see the module's docstring);
    None without the bridge, outside such a span, or when no span above it names an agent."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    processor = getattr(trace.get_tracer_provider(), _BRIDGE, None)
    if processor is None:
        return None
    return processor.agent_of(trace.get_current_span().get_span_context().span_id)  # type: ignore[no-any-return]


def instrument_langchain() -> bool:
    """Instrument LangChain with ``opentelemetry-instrumentation-langchain`` when the agent uses
    LangChain (``langchain_core`` is imported) and that package is installed; True when it is
    instrumented (now or before). Prompts and completions are kept out of its spans unless
    ``TRACELOOP_TRACE_CONTENT`` says otherwise: the gateway records every call whole already."""
    if "langchain_core" not in sys.modules:
        return False
    try:
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor
    except ImportError:
        return False
    os.environ.setdefault("TRACELOOP_TRACE_CONTENT", "false")
    instrumentor = LangchainInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
    return True


def _processor() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class RolloutSpanProcessor(SpanProcessor):
        """Remembers which rollout each span started in, and the agent it runs in; records it in
        its rollout when it ends."""

        def __init__(self) -> None:
            self._started: dict[int, RolloutContext] = {}
            self._agents: dict[int, str] = {}  # span id -> the agent it runs in, while it runs
            self._lock = threading.Lock()

        def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
            context = _current.get()
            if context is None:
                return
            named = (span.attributes or {}).get(ATTR_GENAI_AGENT_NAME)
            with self._lock:
                self._started[span.context.span_id] = context
                if not (isinstance(named, str) and named) and span.parent is not None:
                    named = self._agents.get(span.parent.span_id)
                if isinstance(named, str) and named:
                    self._agents[span.context.span_id] = named

        def agent_of(self, span_id: int) -> str | None:
            with self._lock:
                return self._agents.get(span_id)

        def on_end(self, span: ReadableSpan) -> None:
            if span.context is None:
                return
            with self._lock:
                context = self._started.pop(span.context.span_id, None)
                self._agents.pop(span.context.span_id, None)
            if context is None:
                return
            # The SDK calls this from the agent's span.end() without a guard of its own: a span
            # fulgor cannot store must not become the agent's exception.
            try:
                converted = _to_span(span, context)
            except Exception as error:
                context.count_lost()
                logger.error(
                    "OpenTelemetry span %.200r of rollout %s not converted (counted in spans_lost): %s",
                    span.name,
                    context.rollout_id,
                    error,
                )
                return
            try:
                context.record(converted)
            except AgentError as refused:  # ended, or a reserved name: never the agent's exception
                context.count_lost()
                logger.warning("OpenTelemetry span %.200r not recorded: %s", span.name, refused.message)

        def shutdown(self) -> None:
            with self._lock:
                self._started.clear()
                self._agents.clear()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return RolloutSpanProcessor()


def _to_span(span: ReadableSpan, context: RolloutContext) -> Span:
    assert span.context is not None
    start = (span.start_time or 0) / _NANOSECONDS
    end = None if span.end_time is None else span.end_time / _NANOSECONDS
    return Span(
        rollout_id=context.rollout_id,
        attempt_id=context.attempt_id,
        trace_id=f"{span.context.trace_id:032x}",
        span_id=f"{span.context.span_id:016x}",
        parent_id=None if span.parent is None else f"{span.parent.span_id:016x}",
        name=span.name[:_NAME_LIMIT],
        start_time=start,
        end_time=end,
        attributes=_plain(span.attributes),
        events=tuple(
            SpanEvent(
                name=event.name, time=event.timestamp / _NANOSECONDS, attributes=_plain(event.attributes)
            )
            for event in span.events
        ),
        status=SpanStatus(
            code=_STATUS.get(span.status.status_code.value, "unset"), message=span.status.description
        ),
        resource=_plain(span.resource.attributes),
    )


def _plain(attributes: Any) -> dict[str, Any]:
    """OpenTelemetry attribute values (str, bool, numbers, and tuples of them) as JSON values; a
    NaN or infinite float becomes the string OTLP/JSON writes for it, as the OTLP endpoint stores it."""
    if not attributes:
        return {}
    return {
        key: [_json(item) for item in value] if isinstance(value, tuple) else _json(value)
        for key, value in attributes.items()
    }


def _json(value: Any) -> Any:
    return json_float(value) if isinstance(value, float) else value
