"""Name each LangGraph node's model calls in an ``X-Fulgor-Agent`` header, when the call is made.

The agent's OpenTelemetry spans name the node of every call once the rollout has ended
(:mod:`fulgor.adapters.agents`), which is enough to train some agents and not others. Serving each
agent with a model of its own (one LoRA adapter per agent, ``LLM.agent_models``) needs the name
earlier, when the gateway routes the call. So in a rollout whose ``llm`` resource routes agents
apart (:attr:`fulgor.agent.context.RolloutContext.names_agent_calls`), a ``langchain-openai`` chat
model called inside a LangGraph node sends that node's name as the header (LangGraph puts it in the
call's ``langgraph_node`` metadata). A client whose default headers already name its agent keeps
its own name. Nothing changes in other rollouts or outside rollouts.

What it does not know: where the name goes next (the gateway), or what the spans say.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from fulgor.agent.context import _current

__all__ = ["AGENT_HEADER", "name_langgraph_calls"]

AGENT_HEADER = "X-Fulgor-Agent"
_METHODS = ("_generate", "_agenerate", "_stream", "_astream")
_MARK = "_fulgor_names_agent"


def name_langgraph_calls() -> bool:
    """Wrap ``langchain-openai``'s chat model once, when the agent has imported it; True when it
    is wrapped (now or before)."""
    if "langchain_openai" not in sys.modules:
        return False
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        return False
    for name in _METHODS:
        original = getattr(BaseChatOpenAI, name, None)
        if original is not None and not getattr(original, _MARK, False):
            setattr(BaseChatOpenAI, name, _named(original))
    return True


def _named(original: Callable[..., Any]) -> Callable[..., Any]:
    # A plain function returning what the original returns (a result, a coroutine or a generator),
    # so one wrapper serves the four methods.
    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        context = _current.get()
        if context is not None and context.names_agent_calls:
            _add_header(self, args, kwargs)
        return original(self, *args, **kwargs)

    setattr(call, _MARK, True)
    return call


def _add_header(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    run_manager = kwargs.get("run_manager", args[2] if len(args) > 2 else None)
    metadata = getattr(run_manager, "metadata", None) or {}
    node = metadata.get("langgraph_node")
    if not isinstance(node, str) or not node:
        return
    defaults = getattr(model, "default_headers", None) or {}
    headers = dict(kwargs.get("extra_headers") or {})
    if any(key.lower() == AGENT_HEADER.lower() for key in (*defaults, *headers)):
        return
    headers[AGENT_HEADER] = node
    kwargs["extra_headers"] = headers
