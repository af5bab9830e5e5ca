"""Which agent made each call: the X-Fulgor-Agent header, else the nearest span that names one."""

from __future__ import annotations

from typing import Any

from fulgor import semconv
from fulgor.adapters import model_calls
from fulgor.adapters.agents import span_agent_name
from fulgor.types import ModelCall, Span

LANGGRAPH_NODE = "traceloop.association.properties.langgraph_node"


def span(span_id: str, parent: str | None, name: str = "op", **attributes: Any) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        trace_id="t" * 32,
        span_id=span_id,
        parent_id=parent,
        name=name,
        start_time=1.0,
        attributes=attributes,
    )


def call_span(span_id: str, parent: str | None, agent: str | None = None, sequence_id: int = 1) -> Span:
    record = ModelCall(request={}, prompt_token_ids=[1], response_token_ids=[2], agent_name=agent)
    return span(
        span_id, parent, semconv.SPAN_MODEL_CALL, **{semconv.ATTR_MODEL_CALL: record.model_dump(mode="json")}
    ).model_copy(update={"sequence_id": sequence_id})


def agents(spans: list[Span]) -> list[str | None]:
    return [call.agent_name for _, call in model_calls(spans)]


def test_a_call_takes_the_nearest_langgraph_node_above_its_traceparent() -> None:
    # As OpenTelemetry's LangChain instrumentation records a graph: the graph names itself an
    # agent (GenAI conventions), each node and the chat span inside it name the node.
    spans = [
        span("graph", None, "LangGraph.workflow", **{"gen_ai.agent.name": "LangGraph"}),
        span("node-w", "graph", "execute_task write_query", **{LANGGRAPH_NODE: "write_query"}),
        span("chat-w", "node-w", "ChatOpenAI.chat", **{LANGGRAPH_NODE: "write_query"}),
        span("node-c", "graph", "execute_task check_query", **{LANGGRAPH_NODE: "check_query"}),
        span("plain", "node-c", "ChatOpenAI.chat"),  # no name of its own: its parent's counts
        call_span("call-1", "chat-w", sequence_id=1),
        call_span("call-2", "plain", sequence_id=2),
        call_span("call-3", "graph", sequence_id=3),
    ]
    assert agents(spans) == ["write_query", "check_query", "LangGraph"]


def test_the_header_wins_and_unknown_parents_leave_no_name() -> None:
    spans = [
        span("node", None, **{LANGGRAPH_NODE: "check_query"}),
        call_span("call-1", "node", agent="from-header", sequence_id=1),
        call_span("call-2", "gone", sequence_id=2),  # its parent span never reached the store
        call_span("call-3", None, sequence_id=3),  # no traceparent was sent
    ]
    assert agents(spans) == ["from-header", None, None]


def test_fulgor_agent_name_comes_first_on_a_span_and_a_cycle_ends() -> None:
    both = span("s", None, **{semconv.ATTR_AGENT_NAME: "mine", "gen_ai.agent.name": "theirs"})
    assert span_agent_name(both) == "mine"
    assert span_agent_name(span("s", None, **{"gen_ai.agent.name": ""})) is None
    looped = [span("a", "b"), span("b", "a"), call_span("call", "a")]
    assert agents(looped) == [None]
