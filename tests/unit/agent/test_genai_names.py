"""A request to the rollout's gateway made inside an OpenTelemetry agent span (``gen_ai.agent.name``)
names that agent in its X-Fulgor-Agent header, through httpx and httpx2; a span below the agent's
inherits its name; a name the request carries stays; other URLs, calls outside rollouts and calls
outside agent spans are left alone."""

from __future__ import annotations

import importlib
from typing import Any
from unittest.mock import MagicMock

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace

from fulgor.agent.context import RolloutContext, use_context
from fulgor.agent.genai import name_calls_by_agent_spans
from fulgor.agent.otel import current_agent_name, install

GATEWAY = "http://127.0.0.1:9/r/ro-1/at-1/v1/chat/completions"


def agent_span(name: str) -> Any:
    """An agent's turn as AutoGen traces it: an ``invoke_agent`` span naming the agent, made current."""
    span = trace.get_tracer("a-framework").start_as_current_span
    return span(f"invoke_agent {name}", attributes={"gen_ai.agent.name": name})


@pytest.fixture(scope="module", params=["httpx", "httpx2"])
def library(request: pytest.FixtureRequest) -> object:
    install()  # the global provider, as a runner installs it
    assert name_calls_by_agent_spans()
    return importlib.import_module(request.param)


def sent_agent(library: object, url: str = GATEWAY, **headers: str) -> str | None:
    """The X-Fulgor-Agent header a request to ``url`` was sent with."""
    seen: list[str | None] = []

    def answer(request: object) -> object:
        seen.append(request.headers.get("X-Fulgor-Agent"))  # type: ignore[attr-defined]
        return library.Response(200, json={})  # type: ignore[attr-defined]

    with library.Client(transport=library.MockTransport(answer)) as client:  # type: ignore[attr-defined]
        client.post(url, json={}, headers=headers)
    return seen[0]


def rollout() -> RolloutContext:
    return RolloutContext(rollout_id="ro-1", attempt_id="at-1", writer=MagicMock())


def test_a_call_in_an_agent_span_or_below_names_the_agent(library: object) -> None:
    tracer = trace.get_tracer("a-framework")
    with use_context(rollout()):
        with tracer.start_as_current_span(
            "invoke_agent planner", attributes={"gen_ai.agent.name": "planner"}
        ):
            assert current_agent_name() == "planner"
            assert sent_agent(library) == "planner"
            with tracer.start_as_current_span("execute_tool search"):
                assert sent_agent(library) == "planner"
                with tracer.start_as_current_span(
                    "invoke_agent critic", attributes={"gen_ai.agent.name": "critic"}
                ):
                    assert sent_agent(library) == "critic"  # the nearest agent's
            assert sent_agent(library, **{"x-fulgor-agent": "mine"}) == "mine"  # a name sent stays
            assert sent_agent(library, url="http://127.0.0.1:9/r/ro-2/at-9/v1/chat/completions") is None
        assert current_agent_name() is None
        assert sent_agent(library) is None  # outside any agent's span


def test_nothing_changes_outside_rollouts(library: object) -> None:
    with agent_span("planner"):
        assert current_agent_name() is None  # a span outside rollouts is not the bridge's
        assert sent_agent(library) is None


def test_the_clients_are_wrapped_once(library: object) -> None:
    wrapped = library.AsyncClient.send  # type: ignore[attr-defined]
    assert name_calls_by_agent_spans()
    assert library.AsyncClient.send is wrapped  # type: ignore[attr-defined]
