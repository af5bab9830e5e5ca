"""Name each model call made inside an OpenTelemetry agent span in an ``X-Fulgor-Agent`` header.

Frameworks that follow OpenTelemetry's GenAI semantic conventions open an ``invoke_agent`` span
naming the agent (``gen_ai.agent.name``) around each of its turns, and call the model while that
span, or one below it, is current: AutoGen AgentChat does, for an agent run alone and for each agent
of a team. With fulgor's OpenTelemetry bridge installed (:mod:`fulgor.agent.otel`, which records
those spans and knows the agent each one runs in), a request to the rollout's own gateway sent
through httpx or httpx2 (the openai and anthropic SDKs, and the clients built on them, send through
one of them) gets that agent's name as the header, so the gateway records the call with it. A
request that names an agent already keeps its name; nothing changes outside rollouts, for other
URLs, or outside such a span.

What it does not know: which framework opened the span, or where the name goes next (the gateway).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from fulgor.agent.context import RolloutContext, _current
from fulgor.agent.langgraph import AGENT_HEADER
from fulgor.agent.otel import current_agent_name

__all__ = ["name_calls_by_agent_spans"]

_MARK = "_fulgor_names_agent"
_HTTP_CLIENTS = ("httpx", "httpx2")  # the openai and anthropic SDKs' own, by version


def name_calls_by_agent_spans() -> bool:
    """Wrap the ``send`` of the installed HTTP client libraries' clients once; True when one is
    wrapped (now or before)."""
    wrapped = False
    for module in _HTTP_CLIENTS:
        if importlib.util.find_spec(module) is None:
            continue
        library = importlib.import_module(module)
        for client in (library.Client, library.AsyncClient):
            original = client.__dict__.get("send")
            if original is not None and not getattr(original, _MARK, False):
                client.send = _named(original)
            wrapped = True
    return wrapped


def _named(original: Callable[..., Any]) -> Callable[..., Any]:
    # AsyncClient.send returns a coroutine, Client.send a response: a plain function that names the
    # request and returns what the original returns serves both.
    @functools.wraps(original)
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        context = _current.get()
        if context is not None:
            _name(request, context)
        return original(self, request, *args, **kwargs)

    setattr(send, _MARK, True)
    return send


def _name(request: Any, context: RolloutContext) -> None:
    if AGENT_HEADER in request.headers or f"/r/{context.rollout_id}/" not in request.url.path:
        return
    name = current_agent_name()
    if name is not None:
        request.headers[AGENT_HEADER] = name
