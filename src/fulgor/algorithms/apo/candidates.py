"""Candidates of prompt optimisation: a set of prompts, where it came from, how it scored.

A :class:`Candidate` holds every prompt of the agent (one of them edited from its parent's), the
critique the edit answered, its status and its reward on each validation task it ran (by the
task's index). ``read_edit`` turns an editor's answer into a template, or says why it cannot be
one: the answer must parse as a template of the same engine and keep exactly the placeholders of
the prompt it edits, because the agent fills those and only those. ``pareto_weights`` are GEPA's
parent weights: how many validation tasks each candidate is best on, among those no other
candidate dominates.

What it does not know: how candidates are made or run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jinja2 import TemplateSyntaxError

from fulgor.types import JsonDict, PromptTemplate

__all__ = ["Candidate", "Status", "pareto_weights", "read_edit"]

Status = Literal["seed", "kept", "dropped", "rejected"]

# An editor that answers with the template in one fenced block: the block is the template.
_FENCED = re.compile(r"^\s*```[\w-]*\n(.*?)\n```\s*$", re.DOTALL)
_MAX_GROWTH = 20  # an edit may make a prompt at most this many times longer (and 2,000 characters)


@dataclass
class Candidate:
    """One set of prompts the search tried; see the module docstring."""

    id: str
    prompts: dict[str, PromptTemplate]
    step: int
    parent: str | None = None
    edited: str | None = None
    critique: str | None = None
    status: Status = "kept"
    reason: str | None = None
    val_scores: dict[str, float] = field(default_factory=dict)
    minibatch: dict[str, float] | None = None

    def score(self, keys: Sequence[str] | None = None) -> float | None:
        """The mean reward over ``keys`` (default: every validation task it ran); None when it ran none."""
        values = list(self.val_scores.values()) if keys is None else [self.val_scores[k] for k in keys]
        return sum(values) / len(values) if values else None

    def to_json(self) -> JsonDict:
        return {
            "id": self.id,
            "step": self.step,
            "parent": self.parent,
            "edited": self.edited,
            "status": self.status,
            "reason": self.reason,
            "critique": self.critique,
            "prompts": {name: p.model_dump(exclude={"kind"}) for name, p in self.prompts.items()},
            "val_score": self.score(),
            "val_scores": self.val_scores,
            "minibatch": self.minibatch,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(
            id=data["id"],
            prompts={name: PromptTemplate(**p) for name, p in data["prompts"].items()},
            step=int(data["step"]),
            parent=data.get("parent"),
            edited=data.get("edited"),
            critique=data.get("critique"),
            status=data.get("status", "kept"),
            reason=data.get("reason"),
            val_scores={str(k): float(v) for k, v in data.get("val_scores", {}).items()},
            minibatch=data.get("minibatch"),
        )


def read_edit(original: PromptTemplate, answer: str) -> tuple[PromptTemplate | None, str | None]:
    """The template the editor's ``answer`` holds, or None and why it is not usable.

    >>> seed = PromptTemplate(template="Book a room for {n}.")
    >>> read_edit(seed, "Book the smallest room for {n}.")[0].template
    'Book the smallest room for {n}.'
    >>> read_edit(seed, "Book a room.")[1]
    'it drops the placeholder {n}, which the agent fills; keep every placeholder'
    """
    fenced = _FENCED.match(answer)
    text = (fenced.group(1) if fenced else answer).strip("\n")
    if not text.strip():
        return None, "the editor answered with no text"
    if text.strip() == original.template.strip():
        return None, "the editor returned the prompt unchanged"
    if len(text) > max(_MAX_GROWTH * len(original.template), 2000):
        return None, f"it is {len(text)} characters long, over {_MAX_GROWTH} times the prompt it edits"
    edited = PromptTemplate(template=text, engine=original.engine)
    try:
        found = edited.placeholders
    except (ValueError, TemplateSyntaxError) as error:  # string.Formatter's, jinja2's
        return None, f"it is not a valid {original.engine} template ({error})"
    return (
        (None, problem) if (problem := _placeholder_problem(original.placeholders, found)) else (edited, None)
    )


def _placeholder_problem(expected: set[str], found: set[str]) -> str | None:
    dropped, added = sorted(expected - found), sorted(found - expected)
    parts = []
    if dropped:
        names = ", ".join("{" + name + "}" for name in dropped)
        parts.append(f"drops the placeholder{'s' if len(dropped) > 1 else ''} {names}, which the agent fills")
    if added:
        names = ", ".join("{" + name + "}" for name in added)
        parts.append(f"adds {names}, which the agent does not fill")
    if not parts:
        return None
    return "it " + " and ".join(parts) + "; keep every placeholder"


def pareto_weights(scores: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    """For each candidate best on at least one task (and dominated by none), on how many tasks.

    ``scores`` maps candidate ids to their reward by task; tasks a candidate did not run count as
    not won by it. Ties on a task count for every candidate that ties.

    >>> pareto_weights({"a": {"1": 1.0, "2": 0.0}, "b": {"1": 0.0, "2": 1.0}, "c": {"1": 0.0, "2": 0.5}})
    {'a': 1, 'b': 1}
    """
    tasks = sorted({task for by_task in scores.values() for task in by_task})
    wins: dict[str, int] = {}
    for task in tasks:
        best = max(by_task.get(task, float("-inf")) for by_task in scores.values())
        for candidate, by_task in scores.items():
            if task in by_task and by_task[task] == best:
                wins[candidate] = wins.get(candidate, 0) + 1
    return {
        c: n
        for c, n in wins.items()
        if not any(_dominates(scores[o], scores[c], tasks) for o in wins if o != c)
    }


def _dominates(a: Mapping[str, float], b: Mapping[str, float], tasks: Sequence[str]) -> bool:
    """``a`` at least as good as ``b`` on every task and better on one (a task not run counts -inf)."""
    low = float("-inf")
    pairs = [(a.get(t, low), b.get(t, low)) for t in tasks]
    return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)
