"""Which agent of a multi-agent system made each model call, read from the rollout's spans.

A call's agent name comes, first, from the ``X-Fulgor-Agent`` header the agent's client sent
(``ModelCall.agent_name`` as the gateway recorded it). Without one it comes from the agent's own
OpenTelemetry spans: an instrumented client sends a W3C ``traceparent`` header with each request,
the gateway records its span id as the call span's parent, and the call belongs to the nearest
span on the way up from that parent that names an agent. A span names an agent by, in order:

* ``fulgor.agent.name`` (spans the agent emits through fulgor);
* the LangGraph node it ran in, as OpenTelemetry's LangChain instrumentation
  (``opentelemetry-instrumentation-langchain``) records it on every span inside a node
  (``traceloop.association.properties.langgraph_node``);
* ``gen_ai.agent.name``, OpenTelemetry's GenAI semantic conventions for an agent invocation.

The nearest name wins, so a call inside a LangGraph node takes the node's name rather than the
graph's. A call with neither a header nor a named ancestor keeps no name (``agent_match`` never
matches it). What it does not know: how calls become training rows (``trajectory``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from fulgor import semconv
from fulgor.types import ModelCall, Span

__all__ = ["AGENT_NAME_ATTRIBUTES", "span_agent_name", "with_agent_names"]

AGENT_NAME_ATTRIBUTES: Final = semconv.AGENT_NAME_ATTRIBUTES
"""The span attributes that name an agent, in the order they are read on one span."""

_MAX_DEPTH = 256  # a span tree deeper than this is not an agent's; stop rather than loop on a cycle


def span_agent_name(span: Span) -> str | None:
    """The agent ``span`` names itself, if any (see :data:`AGENT_NAME_ATTRIBUTES`)."""
    for key in AGENT_NAME_ATTRIBUTES:
        value = span.attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _nearest_name(parent_id: str | None, by_id: Mapping[str, Span]) -> str | None:
    for _ in range(_MAX_DEPTH):
        span = by_id.get(parent_id) if parent_id is not None else None
        if span is None:
            return None
        name = span_agent_name(span)
        if name is not None:
            return name
        parent_id = span.parent_id
    return None


def with_agent_names(
    calls: Sequence[tuple[Span, ModelCall]], spans: Iterable[Span]
) -> list[tuple[Span, ModelCall]]:
    """``calls`` with each unnamed call's agent name filled in from its span's ancestors in ``spans``."""
    if all(call.agent_name is not None or span.parent_id is None for span, call in calls):
        return list(calls)
    by_id = {span.span_id: span for span in spans if span.name != semconv.SPAN_MODEL_CALL}
    named = []
    for span, call in calls:
        if call.agent_name is None and span.parent_id is not None:
            name = _nearest_name(span.parent_id, by_id)
            if name is not None:
                call = call.model_copy(update={"agent_name": name})
        named.append((span, call))
    return named
