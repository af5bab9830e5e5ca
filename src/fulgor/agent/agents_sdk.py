"""Name each OpenAI Agents SDK agent's model calls in an ``X-Fulgor-Agent`` header.

The Agents SDK sends nothing that names the agent making a call, and its traces go to its own
processors, not to OpenTelemetry. But it opens a span naming the agent around each of the agent's
turns (a turn span, or the agent span when the run config leaves turns out) and keeps it current
while the model is called, tracing on or off. So inside a rollout, a call through the SDK's two
OpenAI models (Responses and Chat Completions) adds the current agent's name to the request's
headers, and the gateway records it with the call. A call whose model settings already name an
agent keeps that name; nothing changes outside rollouts.

What it does not know: where the name goes next (the gateway), or anything of the SDK's run loop.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

from fulgor.agent.context import _current
from fulgor.agent.langgraph import AGENT_HEADER

__all__ = ["name_agents_sdk_calls"]

_METHODS = ("get_response", "stream_response")
_MARK = "_fulgor_names_agent"


def name_agents_sdk_calls() -> bool:
    """Wrap the Agents SDK's OpenAI models once, when the agent has imported the SDK; True when
    they are wrapped (now or before)."""
    if "agents" not in sys.modules:
        return False
    try:
        from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
        from agents.models.openai_responses import OpenAIResponsesModel
    except ImportError:
        return False
    for model in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        for name in _METHODS:
            original = model.__dict__.get(name)
            if original is not None and not getattr(original, _MARK, False):
                setattr(model, name, _named(original))
    return True


def current_agent_name() -> str | None:
    """The name of the Agents SDK agent whose turn is running here, or None."""
    from agents.tracing import AgentSpanData, TurnSpanData, get_current_span

    data = getattr(get_current_span(), "span_data", None)
    if isinstance(data, TurnSpanData):  # a turn of the agent's run, inside its agent span
        name = data.agent_name
    elif isinstance(data, AgentSpanData):  # the agent's span, when a run config leaves turns out
        name = data.name
    else:
        return None
    return name if isinstance(name, str) and name else None


def _named(original: Callable[..., Any]) -> Callable[..., Any]:
    # ``get_response`` returns a coroutine and ``stream_response`` an async generator: a plain
    # function that rewrites the settings and returns what the original returns serves both.
    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _current.get() is not None:
            args, kwargs = _with_header(args, kwargs)
        return original(self, *args, **kwargs)

    setattr(call, _MARK, True)
    return call


def _with_header(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # model_settings is the third parameter: (system_instructions, input, model_settings, ...).
    settings = kwargs.get("model_settings", args[2] if len(args) > 2 else None)
    name = current_agent_name()
    if settings is None or name is None:
        return args, kwargs
    headers = dict(settings.extra_headers or {})
    if any(key.lower() == AGENT_HEADER.lower() for key in headers):
        return args, kwargs
    settings = dataclasses.replace(settings, extra_headers={**headers, AGENT_HEADER: name})
    if "model_settings" in kwargs:
        return args, {**kwargs, "model_settings": settings}
    return (*args[:2], settings, *args[3:]), kwargs
