"""What each page shows, as plain data for its template: the span tree on a timeline, every model
call with its chat, its tokens and why it was or was not trained on, curves as SVG, prompt diffs.

The token view shows the ids exactly as the store holds them (the engine's), each response token
shaded by its sampling logprob. Whether a call is trained on, and how its tokens sit in its row
(tokens an earlier call of the row already holds, new context under loss mask 0, sampled tokens
under mask 1, a merge break), follows the trainer's own rules: :func:`fulgor.adapters.trajectory.
call_left_out` for each call, :func:`fulgor.training.rollouts.read_outcome` for the rollout.
Nothing here renders HTML; templates escape every string they are given.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fulgor import semconv
from fulgor.adapters.trajectory import DriftReport, call_left_out, model_calls
from fulgor.types import ModelCall, ResourcesVersion, Span

__all__ = [
    "CallView",
    "Chart",
    "SpanNode",
    "TokenView",
    "call_views",
    "charts",
    "prompt_diffs",
    "span_tree",
]

# Why a call is not trained on, in words, by the drift counter that counts it.
LEFT_OUT: Mapping[str, str] = {
    "calls_not_matched": "its agent is not one the run trains (agent_match)",
    "calls_failed": "the call failed: nothing was sampled",
    "calls_missing_ids": "the engine's token ids are missing",
    "calls_empty_response": "it sampled no token",
    "calls_missing_logprobs": "the engine's logprobs are missing",
    "rollouts_without_reward": "the rollout has no reward",
    "rollout_not_succeeded": "the rollout did not succeed",
}

# The drift counters worth a link (volume counters such as calls_total are counts, not problems).
PROBLEMS: tuple[str, ...] = tuple(
    name for name in vars(DriftReport()) if name not in ("calls_total", "calls_trained")
)


@dataclass
class SpanNode:
    """One span on the timeline: its depth in the tree and where its bar starts and ends (%)."""

    span: Span
    depth: int
    left: float
    width: float
    duration: float | None
    attributes: str


def span_tree(spans: Sequence[Span]) -> list[SpanNode]:
    """The spans depth first (children after their parent, by start time); orphans are roots."""
    if not spans:
        return []
    ids = {span.span_id for span in spans}
    children: dict[str | None, list[Span]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids and span.parent_id != span.span_id else None
        children.setdefault(parent, []).append(span)
    start = min(span.start_time for span in spans)
    end = max(max(span.end_time or span.start_time, span.start_time) for span in spans)
    total = max(end - start, 1e-9)
    nodes: list[SpanNode] = []
    seen: set[str] = set()

    def visit(parent: str | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: (s.start_time, s.sequence_id or 0)):
            if span.span_id in seen:  # a cycle of parent ids: show each span once
                continue
            seen.add(span.span_id)
            duration = None if span.end_time is None else max(span.end_time - span.start_time, 0.0)
            left = 100 * (span.start_time - start) / total
            width = max(100 * (duration or 0.0) / total, 0.4)
            attributes = json.dumps(span.attributes, indent=1, ensure_ascii=False, default=str)
            nodes.append(SpanNode(span, depth, left, min(width, 100 - left), duration, attributes))
            visit(span.span_id, min(depth + 1, 24))

    visit(None, 0)
    for span in spans:  # what a cycle kept out of the tree
        if span.span_id not in seen:
            seen.add(span.span_id)
            nodes.append(SpanNode(span, 0, 0.0, 0.4, None, json.dumps(span.attributes, default=str)))
    return nodes


@dataclass(frozen=True)
class TokenView:
    """One token: its id, its text (when a tokenizer is at hand), its part of the row, its logprob."""

    token_id: int
    text: str | None
    part: str
    """``seen`` (an earlier call of the row holds it), ``context`` (mask 0) or ``sampled`` (mask 1);
    ``truncated`` past the run's ``max_trajectory_tokens``; ``untrained`` for every token of a call
    that is not trained on."""
    logprob: float | None = None

    @property
    def shade(self) -> str:
        """The token's background: the less likely the engine found it, the redder."""
        if self.logprob is None or not math.isfinite(self.logprob):
            return ""
        probability = min(max(math.exp(self.logprob), 0.0), 1.0)
        return f"background: rgba(220, 38, 38, {0.85 * (1 - probability):.2f})"

    @property
    def title(self) -> str:
        lp = "" if self.logprob is None else f" · logprob {self.logprob:.4f} · p {math.exp(self.logprob):.3f}"
        return f"id {self.token_id} · {self.part}{lp}"


@dataclass
class CallView:
    """One model call as the rollout page shows it."""

    index: int
    span: Span
    call: ModelCall
    trained: bool
    reason: str
    row: int | None = None
    merged: bool = False
    merge_break: bool = False
    prompt: list[TokenView] = field(default_factory=list)
    response: list[TokenView] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)

    @property
    def ids_missing(self) -> bool:
        return (
            self.call.token_ids_missing
            or self.call.prompt_token_ids is None
            or self.call.response_token_ids is None
        )


def call_views(
    spans: Sequence[Span],
    *,
    agent_match: str | None,
    rollout_problem: str | None,
    decode: Callable[[int], str] | None,
    max_tokens: int | None = None,
) -> list[CallView]:
    """Every model call of ``spans`` (one attempt's), in store order; see the module docstring.

    ``rollout_problem`` is why the whole rollout is not trained on, when it is not (its status, a
    missing reward, lost spans): then no call is, whatever its own tokens. ``max_tokens`` is the
    run's ``max_trajectory_tokens``: the tokens of a row past it are cut off (``truncated``).
    """
    pattern = re.compile(agent_match) if agent_match else None
    views: list[CallView] = []
    row_ids: list[int] | None = None
    row_agent: str | None = None
    row = -1
    for index, (span, call) in enumerate(model_calls(spans)):
        left_out = call_left_out(call, pattern)
        prompt_ids = call.prompt_token_ids or []
        response_ids = call.response_token_ids or []
        logprobs = call.response_logprobs or []
        view = CallView(index, span, call, trained=False, reason="", **_chat(call))
        if left_out is not None or rollout_problem is not None:
            view.reason = LEFT_OUT.get(left_out or "", "") or rollout_problem or ""
            view.prompt = [TokenView(i, _text(decode, i), "untrained") for i in prompt_ids]
            view.response = [
                TokenView(i, _text(decode, i), "untrained", logprobs[n] if n < len(logprobs) else None)
                for n, i in enumerate(response_ids)
            ]
            views.append(view)
            continue
        same_agent = row_ids is not None and row_agent == call.agent_name
        if row_ids is not None and same_agent and prompt_ids[: len(row_ids)] == row_ids:
            view.merged, seen = True, len(row_ids)
        else:
            view.merge_break = row_ids is not None and same_agent
            row, seen = row + 1, 0
        row_ids, row_agent = prompt_ids + response_ids, call.agent_name
        view.trained, view.row = True, row
        view.reason = (
            f"trained in row {row + 1}, merged after the previous call"
            if view.merged
            else f"trained; starts row {row + 1}"
            + (
                " (merge break: its prompt does not extend the previous call's tokens)"
                if view.merge_break
                else ""
            )
        )
        # A call's prompt is its row so far plus its new context, so a token's place in the row is
        # its place in prompt + response.
        limit = len(prompt_ids) + len(response_ids) if max_tokens is None else max_tokens
        view.prompt = [
            TokenView(i, _text(decode, i), "truncated" if n >= limit else "seen" if n < seen else "context")
            for n, i in enumerate(prompt_ids)
        ]
        view.response = [
            TokenView(
                i, _text(decode, i), "truncated" if len(prompt_ids) + n >= limit else "sampled", logprobs[n]
            )
            for n, i in enumerate(response_ids)
        ]
        cut = sum(t.part == "truncated" for t in view.response)
        if cut == len(response_ids):
            view.trained = False
            view.reason = f"cut off: its row passes max_trajectory_tokens ({max_tokens}) before its response"
        elif cut:
            view.reason += f"; its last {cut} sampled tokens cut off by max_trajectory_tokens ({max_tokens})"
        views.append(view)
    return views


def _text(decode: Callable[[int], str] | None, token_id: int) -> str | None:
    return None if decode is None else decode(token_id)


def _chat(call: ModelCall) -> dict[str, Any]:
    """The call's messages and reply as the chat view lists them (roles, text, tool calls)."""
    request = call.request
    messages: list[dict[str, Any]] = []
    raw = request.get("messages")
    if isinstance(raw, list):
        messages = [_message(m) for m in raw]
    elif isinstance(request.get("prompt"), str):
        messages = [_message({"role": "prompt", "content": request["prompt"]})]
    elif request.get("input") is not None:
        messages = [_message({"role": "input", "content": request.get("input")})]
    response = call.response
    message = response.get("message")
    if isinstance(message, dict):
        reply = _message({"role": "assistant", **message})
    else:
        reply = _message({"role": "assistant", "content": response.get("text", "")})
    reply["finish_reason"] = response.get("finish_reason")
    return {"messages": messages, "reply": reply}


def _message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {
            "role": "?",
            "content": _as_text(message),
            "tool_calls": [],
            "tool_call_id": None,
            "name": None,
        }
    tool_calls = message.get("tool_calls")
    calls = []
    for tool_call in tool_calls if isinstance(tool_calls, list) else []:
        function = tool_call.get("function", {}) if isinstance(tool_call, dict) else {}
        calls.append(
            {
                "name": _as_text(function.get("name", "")) if isinstance(function, dict) else "",
                "arguments": _as_text(function.get("arguments", "")) if isinstance(function, dict) else "",
                "id": _as_text(tool_call.get("id", "")) if isinstance(tool_call, dict) else "",
            }
        )
    return {
        "role": _as_text(message.get("role", "?")),
        "content": _as_text(message.get("content")),
        "tool_calls": calls,
        "tool_call_id": _as_text(message.get("tool_call_id")) if message.get("tool_call_id") else None,
        "name": _as_text(message.get("name")) if message.get("name") else None,
    }


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and "text" in p for p in value):
        return "".join(str(p["text"]) for p in value)
    return json.dumps(value, ensure_ascii=False, default=str)


def rewards(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """Each reward span's value, named values and feedback text, in store order."""
    found = []
    for span in spans:
        if span.name == semconv.SPAN_REWARD:
            attributes = span.attributes
            found.append(
                {
                    "value": attributes.get(semconv.ATTR_REWARD_VALUE),
                    "values": attributes.get(semconv.ATTR_REWARD_VALUES) or {},
                    "feedback": attributes.get(semconv.ATTR_REWARD_FEEDBACK),
                    "span": span,
                }
            )
    return found


# -- curves ---------------------------------------------------------------------------------------


@dataclass
class Chart:
    """One metric by step as an SVG polyline in a ``width`` x ``height`` box."""

    name: str
    points: list[tuple[float, float, int, float]]
    """(x, y, step, value) for each step that has the metric."""
    low: float
    high: float
    width: int = 320
    height: int = 120

    @property
    def polyline(self) -> str:
        return " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in self.points)


CURVES: tuple[tuple[str, str], ...] = (
    ("reward_mean", "training reward"),
    ("val_accuracy", "validation accuracy"),
    ("loss", "loss"),
    ("kl", "KL"),
    ("tokens_per_second", "tokens/s"),
    ("drift_losses", "drift (calls or tokens not trained as sampled)"),
)


def charts(history: Sequence[Mapping[str, Any]]) -> list[Chart]:
    """The curves of a run's ``metrics.jsonl`` that have at least one value."""
    found = []
    for key, name in CURVES:
        values = [
            (int(m["step"]), value)
            for m in history
            if "step" in m
            for value in [_metric(m, key)]
            if value is not None
        ]
        if not values:
            continue
        low = min(v for _, v in values)
        high = max(v for _, v in values)
        span = (high - low) or 1.0
        first, last = values[0][0], values[-1][0]
        chart = Chart(name, [], low, high)
        steps = max(last - first, 1)
        for step, value in values:
            x = 8 + (chart.width - 16) * (step - first) / steps
            y = chart.height - 8 - (chart.height - 16) * (value - low) / span
            chart.points.append((x, y, step, value))
        found.append(chart)
    return found


def _metric(metrics: Mapping[str, Any], key: str) -> float | None:
    if key == "drift_losses":
        value: Any = sum(metrics.get(f"drift/{name}", 0) or 0 for name in DriftReport.LOSSES)
    else:
        value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


# -- resources --------------------------------------------------------------------------------------


@dataclass
class ResourceChange:
    """One resource of a version, and its diff against the previous version that had it."""

    name: str
    kind: str
    text: str
    diff: list[tuple[str, str]]
    """(``add``/``remove``/``same``/``hunk``, line) for a prompt template that changed."""
    changed: bool


def prompt_diffs(versions: Sequence[ResourcesVersion]) -> list[tuple[ResourcesVersion, list[ResourceChange]]]:
    """Each version (newest first) with its resources; prompt templates diffed against the previous
    version that held the same name."""
    previous: dict[str, str] = {}
    shown: list[tuple[ResourcesVersion, list[ResourceChange]]] = []
    for version in sorted(versions, key=lambda v: v.version):
        changes = []
        for name, resource in sorted(version.resources.items()):
            data = resource.model_dump(mode="json", exclude={"api_key"})
            kind = str(data.get("kind", "resource"))
            text = (
                data["template"]
                if kind == "prompt_template"
                else json.dumps(data, indent=1, ensure_ascii=False)
            )
            before = previous.get(name)
            diff: list[tuple[str, str]] = []
            if kind == "prompt_template" and before is not None and before != text:
                for line in difflib.unified_diff(before.splitlines(), text.splitlines(), lineterm="", n=2):
                    if line.startswith(("---", "+++")):
                        continue
                    tag = (
                        "hunk" if line.startswith("@@") else {"+": "add", "-": "remove"}.get(line[:1], "same")
                    )
                    diff.append((tag, line))
            changes.append(ResourceChange(name, kind, text, diff, before is not None and before != text))
            previous[name] = text
        shown.append((version, changes))
    return list(reversed(shown))
