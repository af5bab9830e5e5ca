"""Spans -> chat transcripts: what another model said in a rollout, as messages, for distillation.

A recorded chat call holds the messages the agent sent (``request.messages``, with its ``tools``)
and the assistant message the model returned (``response.message``). One call is one transcript:
its messages, then the model's turn. A later call whose messages start with an earlier transcript
exactly (the conversation went on: the model's turn, then tool results or a user turn) extends it,
so that a multi-turn conversation is one transcript with each of the model's turns in it. Messages
the agent wrote itself (history it edited, a turn another agent wrote) are context, never turns to
imitate: only what the model returned is marked as a turn (``Transcript.turns``).

A rollout gives transcripts only when every one of its calls can be used; otherwise it gives none
and one reason (:class:`Unusable`), so that nothing is trained on half a conversation and nothing is
skipped silently.

What it does not know: tokenizers or chat templates (rendering is the student's business).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from fulgor.adapters.trajectory import model_calls, rollout_reward
from fulgor.types import ModelCall, Rollout, Span

__all__ = ["Transcript", "Unusable", "rollout_transcripts"]

# The keys of a chat message a transcript keeps; a hosted API adds others (refusal, annotations).
_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


@dataclass(frozen=True)
class Transcript:
    """A conversation and which of its messages the model produced (the turns to learn)."""

    rollout_id: str
    group_id: str | None
    reward: float
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    turns: tuple[int, ...]
    """Indices into ``messages`` of the assistant turns the recorded model returned."""

    @classmethod
    def of(
        cls,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        name: str = "",
    ) -> Transcript:
        """A transcript written by hand (synthetic solutions), every assistant turn to be learned."""
        turns = tuple(i for i, message in enumerate(messages) if message.get("role") == "assistant")
        return cls(name, None, 1.0, [dict(m) for m in messages], list(tools) if tools else None, turns)


@dataclass(frozen=True)
class Unusable:
    """A rollout that gives no transcript, and why."""

    rollout_id: str
    reason: str


def rollout_transcripts(
    rollout: Rollout, spans: Sequence[Span], *, agent_match: str | None = None
) -> list[Transcript] | Unusable:
    """The rollout's transcripts (calls of ``agent_match`` only), or why it has none."""

    def unusable(reason: str) -> Unusable:
        return Unusable(rollout.rollout_id, reason)

    if rollout.status != "succeeded":
        return unusable(f"the rollout did not succeed (status {rollout.status})")
    reward = rollout_reward(spans)
    if reward is None:
        return unusable("the rollout has no reward (the agent returned or emitted none)")
    try:
        calls = [call for _, call in model_calls(spans)]
    except pydantic.ValidationError:
        return unusable("a model call span does not read back as a model call")
    if agent_match is not None:
        pattern = re.compile(agent_match)
        calls = [call for call in calls if call.agent_name is not None and pattern.search(call.agent_name)]
    if not calls:
        matched = "" if agent_match is None else f" of an agent matching {agent_match!r}"
        return unusable(f"the rollout made no model call{matched}")
    transcripts: list[Transcript] = []
    for number, call in enumerate(calls, start=1):
        problem = _problem(call)
        if problem is not None:
            return unusable(f"call {number}: {problem}")
        messages = [_message(m) for m in call.request["messages"]]
        turn = _message(call.response["message"])
        tools = call.request.get("tools") or None
        last = transcripts[-1] if transcripts else None
        if last is not None and last.tools == tools and messages[: len(last.messages)] == last.messages:
            transcripts[-1] = Transcript(
                rollout.rollout_id, rollout.group_id, reward, [*messages, turn], tools,
                (*last.turns, len(messages)),
            )  # fmt: skip
        else:
            transcripts.append(
                Transcript(
                    rollout.rollout_id, rollout.group_id, reward, [*messages, turn], tools, (len(messages),)
                )
            )
    return transcripts


def _problem(call: ModelCall) -> str | None:
    """Why a call cannot be part of a transcript, or None."""
    if call.error is not None:
        return f"it failed ({call.error[:64]})"
    messages = call.request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "it is a text completion (a prompt, not chat messages): there is no conversation to render"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "its request messages are not chat messages"
    message = call.response.get("message")
    if not isinstance(message, dict):
        return "its response holds no assistant message"
    if call.response.get("finish_reason") == "length":
        return "the model's turn was cut off at max_tokens (finish_reason length): it is incomplete"
    for where, tool_calls in [("its response", message.get("tool_calls"))] + [
        ("its request messages", m.get("tool_calls")) for m in messages
    ]:
        if tool_calls is not None and not isinstance(tool_calls, list):
            return f"the tool calls of {where} are not a list"
        for tool_call in tool_calls or ():
            problem = _tool_call_problem(tool_call)
            if problem is not None:
                return f"a tool call of {where}: {problem}"
    return None


def _tool_call_problem(tool_call: Any) -> str | None:
    function = tool_call.get("function") if isinstance(tool_call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return "it has no function name"
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        return f"the arguments of {function['name'][:64]!r} are not JSON"
    if not isinstance(arguments, dict):
        return f"the arguments of {function['name'][:64]!r} are not a JSON object"
    return None


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """The message with the keys a chat template reads, tool calls reduced to id, type and function;
    an assistant's missing content is None, whichever way the API wrote it."""
    kept = {key: message[key] for key in _MESSAGE_KEYS if message.get(key) is not None}
    if kept["role"] == "assistant":
        kept.setdefault("content", None)
        if kept["content"] == "" and kept.get("tool_calls"):
            kept["content"] = None
    if kept.get("tool_calls"):
        kept["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": call["function"].get("arguments") or "{}",
                },
            }
            for call in kept["tool_calls"]
        ]
    return kept
