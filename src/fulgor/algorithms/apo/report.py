"""Prompt optimisation, shown: each step's candidates and their edits, for the run's ``report.html``.

``candidates_html(candidates)`` renders what ``run_dir/apo/candidates.json`` holds: the best
validation score after each step, then per step each candidate (its parent, the prompt edited,
its status and why, its scores) with the diff of its edited prompt against its parent's, and the
critique the edit followed.
"""

from __future__ import annotations

import difflib
import html
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["candidates_html"]


def candidates_html(candidates: Sequence[Mapping[str, Any]]) -> str:
    """HTML sections for the candidates of a prompt search (see the module docstring)."""
    by_id = {c["id"]: c for c in candidates}
    steps = sorted({int(c["step"]) for c in candidates})
    parts = ["<h2>Prompt search</h2>", _best_by_step(candidates, steps)]
    for step in steps:
        title = "Starting prompts" if step == 0 else f"Step {step}"
        parts.append(f"<h3>{title}</h3>")
        parts += [_candidate(c, by_id.get(c.get("parent") or "")) for c in candidates if c["step"] == step]
    return "\n".join(parts)


def _best_by_step(candidates: Sequence[Mapping[str, Any]], steps: list[int]) -> str:
    """The best whole-validation score among the candidates made up to each step."""
    rows, best = [], None
    full = max((len(c.get("val_scores") or {}) for c in candidates), default=0)
    for step in steps:
        scored = [
            c["val_score"]
            for c in candidates
            if c["step"] == step and c.get("val_score") is not None and len(c["val_scores"]) == full
        ]
        if scored:
            best = max([best, *scored]) if best is not None else max(scored)
        made = sum(c["step"] == step for c in candidates)
        rows.append(f"<tr><td>{step}</td><td>{_score(best)}</td><td>{made}</td></tr>")
    return (
        "<table><thead><tr><th>step</th><th>best validation score</th><th>candidates</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _candidate(candidate: Mapping[str, Any], parent: Mapping[str, Any] | None) -> str:
    facts = [
        f"<b>{html.escape(candidate['id'])}</b>",
        f"status {html.escape(str(candidate.get('status')))}",
        f"validation {_score(candidate.get('val_score'))} on {len(candidate.get('val_scores') or {})} tasks",
    ]
    if parent is not None:
        edited = html.escape(str(candidate.get("edited")))
        facts.insert(1, f"from {html.escape(parent['id'])}, editing <code>{edited}</code>")
    minibatch = candidate.get("minibatch")
    if minibatch:
        facts.append(
            f"minibatch {_score(minibatch.get('parent'))} (parent) vs {_score(minibatch.get('child'))}"
        )
    body = [f"<p>{' · '.join(facts)}</p>"]
    if candidate.get("reason"):
        body.append(f"<p class='reason'>rejected: {html.escape(candidate['reason'])}</p>")
    for name, prompt in candidate["prompts"].items():
        before = (
            parent["prompts"][name]["template"] if parent is not None and name in parent["prompts"] else None
        )
        if parent is not None and before == prompt["template"]:
            continue
        body.append(f"<p><code>{html.escape(name)}</code></p>{_diff(before, prompt['template'])}")
    if candidate.get("critique"):
        body.append(
            f"<details><summary>critique</summary><pre>{html.escape(candidate['critique'])}</pre></details>"
        )
    return f"<div class='candidate'>{''.join(body)}</div>"


def _diff(before: str | None, after: str) -> str:
    """The lines of ``after`` against ``before``: added ones green, removed ones red."""
    if before is None:
        return f"<pre>{html.escape(after)}</pre>"
    lines = []
    for line in difflib.ndiff(before.splitlines(), after.splitlines()):
        tag, text = line[:2], html.escape(line[2:])
        if tag == "+ ":
            lines.append(f"<ins>+ {text}</ins>")
        elif tag == "- ":
            lines.append(f"<del>- {text}</del>")
        elif tag == "  ":
            lines.append(f"  {text}")
    return "<pre class='diff'>" + "\n".join(lines) + "</pre>"


def _score(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.3f}"
