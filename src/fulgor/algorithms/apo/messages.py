"""What the critic and the editor of prompt optimisation are sent.

The critic sees what a person would look at: the prompt under critique (``<prompt name=...>``),
the agent's other prompts for context (``<other_prompt>``), and each rollout as the recorded model
calls show it (every message the agent sent, the model's answers and tool calls, tool results),
with its reward and the task's own feedback text when the reward carried one. The editor gets the
prompt, its placeholders and the critique, and answers with the new prompt only.

What it does not know: which model answers, or what is done with the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fulgor.adapters.trajectory import model_calls, rollout_feedback, rollout_reward
from fulgor.store.base import Store
from fulgor.types import ModelCall, PromptTemplate

__all__ = ["RolloutView", "critic_messages", "editor_messages", "rollout_view"]

CRITIC_SYSTEM = (
    "You improve the prompts of an AI agent. You are shown one of its prompts and rollouts of the "
    "agent run with it: the messages of every model call, tool calls and their results, the reward "
    "each rollout got and the task's own feedback. Find what in the prompt made rollouts lose reward."
)
CRITIC_TASK = (
    "Write a brief critique of the prompt: a bullet list of specific, testable changes (rules to "
    "state, definitions, ordering, output format) that would raise the reward next time."
)
EDITOR_SYSTEM = (
    "You rewrite one prompt of an AI agent so that it follows a critique. Answer with the new "
    "prompt only: no explanation, no heading."
)
_MAX_MESSAGE_CHARS = 4000  # a long tool result is cut: the critic needs its gist, not all of it


@dataclass(frozen=True)
class RolloutView:
    """One rollout as the critic sees it."""

    status: str
    reward: float | None
    feedback: str | None
    conversation: list[str]


async def rollout_view(store: Store, rollout_id: str, status: str) -> RolloutView:
    """The rollout's recorded calls as lines of conversation, with its reward and feedback."""
    spans = await store.query_spans(rollout_id)
    lines: list[str] = []
    shown: list[Any] = []
    for _, call in model_calls(spans):
        messages = _request_messages(call)
        if messages[: len(shown)] != shown:  # another conversation (another agent, edited history)
            lines.append("--- another model call ---")
            shown = []
        lines += [_line(m) for m in messages[len(shown) :]]
        answer = call.response.get("message")
        if isinstance(answer, dict):
            lines.append(_line(answer))
            shown = [*messages, answer]
        elif call.error:
            lines.append(f"[model call failed] {call.error}")
            shown = messages
    return RolloutView(status, rollout_reward(spans), rollout_feedback(spans), lines)


def critic_messages(
    name: str, prompts: Mapping[str, PromptTemplate], views: Sequence[RolloutView]
) -> list[dict[str, str]]:
    """The critic's request for the prompt ``name`` of ``prompts``, given rollouts run with them."""
    parts = [_prompt_block("prompt", name, prompts[name])]
    parts += [_prompt_block("other_prompt", other, p) for other, p in prompts.items() if other != name]
    for index, view in enumerate(views, start=1):
        reward = "none" if view.reward is None else f"{view.reward:g}"
        body = [f'<rollout index="{index}" reward="{reward}" status="{view.status}">']
        if view.feedback:
            body.append(f"<feedback>{view.feedback}</feedback>")
        body += view.conversation
        body.append("</rollout>")
        parts.append("\n".join(body))
    parts.append(CRITIC_TASK)
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def editor_messages(name: str, prompt: PromptTemplate, critique: str) -> list[dict[str, str]]:
    """The editor's request: rewrite ``prompt`` following ``critique``, keeping its placeholders."""
    placeholders = ", ".join("{" + p + "}" for p in sorted(prompt.placeholders)) or "none"
    syntax = "jinja2 ({{ name }})" if prompt.engine == "jinja" else "Python str.format ({name})"
    text = "\n\n".join(
        [
            _prompt_block("prompt", name, prompt),
            f"<critique>\n{critique.strip()}\n</critique>",
            f"Keep exactly these placeholders, in {syntax} syntax: {placeholders}. Literal braces "
            "must stay escaped as the template's syntax requires. Answer with the whole new prompt.",
        ]
    )
    return [{"role": "system", "content": EDITOR_SYSTEM}, {"role": "user", "content": text}]


def _prompt_block(tag: str, name: str, prompt: PromptTemplate) -> str:
    return f'<{tag} name="{name}">\n{prompt.template}\n</{tag}>'


def _request_messages(call: ModelCall) -> list[Any]:
    messages = call.request.get("messages")
    listed = list(messages) if isinstance(messages, list) else []
    system = call.request.get("system")  # Anthropic's Messages API keeps it apart
    if system:
        listed.insert(0, {"role": "system", "content": system})
    if not listed and "prompt" in call.request:
        listed.append({"role": "prompt", "content": call.request["prompt"]})
    return listed


def _line(message: Any) -> str:
    """``[role] text`` of one message, tool calls as ``name(arguments)``."""
    if not isinstance(message, dict):
        return f"[message] {_cut(json.dumps(message))}"
    role = str(message.get("role", "message"))
    if role == "tool" and message.get("name"):
        role = f"tool {message['name']}"
    text = _text(message.get("content"))
    calls = [
        f"{f.get('name')}({f.get('arguments') or ''})"
        for c in message.get("tool_calls") or ()
        if isinstance(c, dict) and isinstance(f := c.get("function"), dict)
    ]
    if calls:
        text = (text + " " if text else "") + "calls " + "; ".join(calls)
    return f"[{role}] {_cut(text)}"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(
            str(part.get("text", "")) if isinstance(part, dict) and "text" in part else json.dumps(part)
            for part in content
        )
    return json.dumps(content)


def _cut(text: str) -> str:
    if len(text) <= _MAX_MESSAGE_CHARS:
        return text
    return text[:_MAX_MESSAGE_CHARS] + f" [... {len(text) - _MAX_MESSAGE_CHARS} more characters]"
