"""The Agents SDK's model calls name their agent (an X-Fulgor-Agent header) from the SDK's own
turn or agent span, inside rollouts only, and a name the agent set itself stays."""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

import pytest

pytest.importorskip("agents")

from agents import ModelSettings, set_tracing_disabled
from agents.tracing import agent_span, turn_span

from fulgor.agent.agents_sdk import _named, current_agent_name, name_agents_sdk_calls
from fulgor.agent.context import RolloutContext, use_context

set_tracing_disabled(True)


def settings_sent(*args: Any, **kwargs: Any) -> ModelSettings:
    """What a wrapped model method receives as its model settings."""
    seen: list[ModelSettings] = []

    def original(self: Any, system: Any, input: Any, model_settings: ModelSettings, *rest: Any) -> None:
        seen.append(model_settings)

    _named(original)(object(), *args, **kwargs)
    return seen[0]


def rollout() -> RolloutContext:
    return RolloutContext(rollout_id="ro-1", attempt_id="at-1", writer=MagicMock())


def test_a_call_in_a_turn_names_the_turns_agent() -> None:
    with use_context(rollout()), turn_span(turn=1, agent_name="researcher"):  # entered: started and current
        assert current_agent_name() == "researcher"
        sent = settings_sent("instructions", "input", ModelSettings(temperature=0.5), [], None)
    assert sent.extra_headers == {"X-Fulgor-Agent": "researcher"}
    assert sent.temperature == 0.5  # the rest of the settings unchanged


def test_the_agent_span_names_it_when_turn_spans_are_off_and_keyword_settings_work() -> None:
    with use_context(rollout()), agent_span(name="writer"):  # entered: started and current
        sent = settings_sent("instructions", "input", model_settings=ModelSettings())
    assert sent.extra_headers == {"X-Fulgor-Agent": "writer"}


def test_a_name_the_agent_set_stays_and_nothing_changes_outside_rollouts() -> None:
    own = ModelSettings(extra_headers={"x-fulgor-agent": "mine"})
    with turn_span(turn=1, agent_name="researcher"):  # entered: started and current
        outside = settings_sent("i", "in", ModelSettings())
        with use_context(rollout()):
            kept = settings_sent("i", "in", own)
    assert outside.extra_headers is None
    assert kept.extra_headers == {"x-fulgor-agent": "mine"}


def test_no_agent_span_no_header() -> None:
    with use_context(rollout()):
        assert settings_sent("i", "in", ModelSettings()).extra_headers is None


def test_the_sdk_models_are_wrapped_once() -> None:
    from agents.models.openai_responses import OpenAIResponsesModel

    assert name_agents_sdk_calls()
    wrapped = OpenAIResponsesModel.get_response
    assert name_agents_sdk_calls()
    assert OpenAIResponsesModel.get_response is wrapped
