"""Simulated models for the room-booking task: an agent model, and a prompt optimiser's model.

They answer a :class:`~fulgor.testing.ScriptedOpenAIServer` (as its ``responder``) the way a model
would in prompt optimisation of the rooms example, from nothing but the request they are sent, and
in microseconds, so tests and demos run the whole loop without a real model:

* :class:`RoomsModel`, the simulated agent model. It calls ``list_rooms`` with the date and time of
  the meeting, then books a room following only the rules that its prompt (the system and user
  messages, never the tool's result) states. A rule is stated when one sentence of the prompt
  carries its keywords (:func:`stated_rules`); a hard constraint it is not told is not checked, and
  a tie-break it is not told leaves the rooms in the tool's order. So its accuracy measures the
  prompt: low for a prompt that states no rule, perfect for one that states all eight.
* :class:`RoomsOptimizer`, the simulated critic and editor. The critic names one or two rules the
  prompt under critique does not state (as their sentences in :data:`RULE_SENTENCES`) when a
  rollout it is shown fell short of reward 1; the editor appends to the prompt each of those
  sentences that the critique names. It reads fulgor's requests (``<prompt name=...>``,
  ``<rollout ... reward=...>``, ``<critique>``) and the five that Agent Lightning 0.3.0 renders from
  its POML templates (three critics, ``text_gradient``, and two editors, ``apply_edit``).

Nothing here imports the example: the simulations understand the task as a model would.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall

__all__ = [
    "HARD_RULES",
    "NO_CHANGE",
    "RULE_SENTENCES",
    "TIE_BREAKS",
    "OptimizerRequest",
    "RoomsModel",
    "RoomsOptimizer",
    "edit",
    "read_request",
    "simulated_optimizer",
    "simulated_rooms_model",
    "stated_rules",
]

JsonDict = dict[str, Any]

HARD_RULES = ("capacity", "equipment", "accessible", "availability")
TIE_BREAKS = ("spare", "extra", "distance", "bookings")
RULE_SENTENCES: dict[str, str] = {
    "capacity": "The room must seat every attendee.",
    "equipment": "The room must have all the equipment the meeting needs.",
    "accessible": "If wheelchair access is needed, the room must be accessible.",
    "availability": "The room must be free for the whole meeting: no booking may overlap it.",
    "spare": "Among the rooms that qualify, prefer the one with the fewest spare seats.",
    "extra": "Then prefer the room with the least extra equipment.",
    "distance": "Then prefer the closest room.",
    "bookings": "Then prefer the room with the fewest bookings that day.",
}
NO_CHANGE = "- No change needed."


def _any(*words: str) -> Callable[[str], bool]:
    return lambda sentence: any(word in sentence for word in words)


def _both(first: Callable[[str], bool], second: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda sentence: first(sentence) and second(sentence)


# Whether one lower-cased sentence states the rule: lenient keywords, as a model would read it.
_DETECTORS: dict[str, Callable[[str], bool]] = {
    "capacity": _both(_any("seat", "capacity"), _any("attendee", "people", "participant")),
    "equipment": _both(_any("equipment"), _any("need", "require")),
    "accessible": _any("accessib"),
    "availability": _any("booked", "free", "available", "overlap"),
    "spare": _any("spare", "smallest room", "tightest fit"),
    "extra": _any("extra equipment", "unneeded equipment", "unused equipment", "equipment it does not need"),
    "distance": _any("closest", "shortest distance", "nearest", "shortest walk"),
    "bookings": _any("fewest bookings", "fewest other bookings", "least busy"),
}


def stated_rules(text: str) -> tuple[str, ...]:
    """The rules ``text`` states (in :data:`HARD_RULES` then :data:`TIE_BREAKS` order): those whose
    keywords one of its sentences carries, placeholders (``{accessible}``) left out.

    >>> stated_rules("Book a room.\\nAttendees: 8\\nThe room must seat every attendee.")
    ('capacity',)
    >>> stated_rules("Wheelchair access: {accessible}")
    ()
    >>> stated_rules(" ".join(RULE_SENTENCES.values())) == HARD_RULES + TIE_BREAKS
    True
    """
    words = re.sub(r"\{\{[^{}]*\}\}|\{[^{}]*\}", " ", text.lower())  # a placeholder's name states nothing
    sentences = [s.strip() for s in re.split(r"[.!?;\n]+", words) if s.strip()]
    return tuple(rule for rule, says in _DETECTORS.items() if any(says(s) for s in sentences))


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _messages(body: JsonDict, *roles: str) -> list[str]:
    return [_text(m.get("content")) for m in body.get("messages") or [] if m.get("role") in roles]


# -- the agent model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Meeting:
    start: int | None
    duration: int
    attendees: int
    needs: frozenset[str]
    accessible: bool


def _minutes(clock: str) -> int:
    hours, mins = clock.strip().split(":")
    return int(hours) * 60 + int(mins)


def _first_int(patterns: tuple[str, ...], text: str) -> int:
    for pattern in patterns:
        match = re.search(pattern, text, re.IGNORECASE)
        if match:
            return int(match.group(1))
    return 0


def _read_meeting(text: str, vocabulary: set[str]) -> _Meeting:
    """The meeting as a model reads it off the user message; what it cannot find is left out."""
    start = re.search(r"\b(\d{1,2}:\d{2})\b", text)
    needs = re.search(r"\bneeds?\s*:\s*([^\n]*)", text, re.IGNORECASE)
    listed = needs.group(1).lower() if needs else ""
    access = re.search(r"\b(?:wheelchair|access\w*)[^\n:]*:\s*(yes|no)\b", text, re.IGNORECASE)
    return _Meeting(
        start=_minutes(start.group(1)) if start else None,
        duration=_first_int((r"(\d+)\s*(?:minutes|mins?)\b",), text),
        attendees=_first_int(
            (r"\battendees?\s*[:=]?\s*(\d+)", r"(\d+)\s+(?:attendees|people|participants|persons)"), text
        ),
        needs=frozenset(item for item in vocabulary if re.search(rf"\b{re.escape(item)}\b", listed)),
        accessible=access is not None and access.group(1).lower() == "yes",
    )


def _is_free(room: JsonDict, meeting: _Meeting) -> bool:
    if meeting.start is None:
        return True
    end = meeting.start + meeting.duration
    for booking in room.get("bookings") or []:
        first, _, last = str(booking).partition("-")
        if _minutes(first) < end and meeting.start < _minutes(last):
            return False
    return True


_FILTERS: dict[str, Callable[[JsonDict, _Meeting], bool]] = {
    "capacity": lambda room, m: int(room.get("capacity", 0)) >= m.attendees,
    "equipment": lambda room, m: m.needs <= set(room.get("equipment") or []),
    "accessible": lambda room, m: bool(room.get("accessible")) or not m.accessible,
    "availability": _is_free,
}
_KEYS: dict[str, Callable[[JsonDict, _Meeting], int]] = {
    "spare": lambda room, m: int(room.get("capacity", 0)) - m.attendees,
    "extra": lambda room, m: len(set(room.get("equipment") or []) - m.needs),
    "distance": lambda room, m: int(room.get("distance_m", 0)),
    "bookings": lambda room, m: len(room.get("bookings") or []),
}


def _choose_room(rooms: list[JsonDict], meeting: _Meeting, rules: tuple[str, ...]) -> str:
    """The room the stated ``rules`` pick: the known filters, then the known tie-breaks in their
    canonical order over the tool's order; "No Room" only when the filters leave nothing."""
    fitting = [r for r in rooms if all(_FILTERS[rule](r, meeting) for rule in rules if rule in _FILTERS)]
    if not fitting:
        return "No Room"
    keys = [_KEYS[rule] for rule in TIE_BREAKS if rule in rules]
    best = min(fitting, key=lambda room: tuple(key(room, meeting) for key in keys))  # first among equals
    return str(best.get("name", "No Room"))


class RoomsModel:
    """The simulated agent model (a responder); see the module docstring."""

    def __call__(self, body: JsonDict) -> ScriptedReply:
        messages = body.get("messages") or []
        results = [_text(m.get("content")) for m in messages if m.get("role") == "tool"]
        users = _messages(body, "user")
        meeting_text = users[0] if users else ""
        if not results:
            return self._look_up(body, meeting_text)
        rules = stated_rules("\n".join(_messages(body, "system", "user")))
        try:
            rooms = json.loads(results[-1])
            vocabulary = {str(item) for room in rooms for item in room.get("equipment") or []}
            return ScriptedReply(text=_choose_room(rooms, _read_meeting(meeting_text, vocabulary), rules))
        except (ValueError, TypeError, AttributeError):  # not JSON, not a list of rooms, odd fields
            return ScriptedReply(text="The room list could not be read.")

    @staticmethod
    def _look_up(body: JsonDict, meeting_text: str) -> ScriptedReply:
        """The first turn: call ``list_rooms`` for the meeting's date and time, when it is offered."""
        names = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
        if "list_rooms" not in names:
            return ScriptedReply(text="I cannot see the rooms without the list_rooms tool.")
        date = re.search(r"\b\d{4}-\d{2}-\d{2}\b", meeting_text)
        start = re.search(r"\b\d{1,2}:\d{2}\b", meeting_text)
        arguments = {"date": date.group(0) if date else "", "time": start.group(0) if start else ""}
        return ScriptedReply(text="", tool_calls=(ScriptedToolCall("list_rooms", arguments),))


# -- the optimiser's model ------------------------------------------------------------------------


def _between(first: str, second: str, tail: str) -> re.Pattern[str]:
    """The text under the heading line ``first`` (the prompt) and under ``second`` (``tail``)."""
    head = rf"^{re.escape(first)}\n\n(?P<template>.*?)\n\n{re.escape(second)}\n\n(?P<{tail}>.*)\Z"
    return re.compile(head, re.S | re.M)


_FULGOR_PROMPT = r'<prompt name="[^"]*">\n(?P<template>.*?)\n</prompt>'
# Editor requests: groups ``template`` and ``critique``.
_EDITORS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fulgor", re.compile(_FULGOR_PROMPT + r".*?<critique>\n(?P<critique>.*?)\n</critique>", re.S)),
    ("agl apply_edit_variant01", _between("# Prompt Template", "# Critique", "critique")),
    ("agl apply_edit_variant02", _between("### PROMPT", "### CRITIQUE", "critique")),
)


@dataclass(frozen=True)
class _Critic:
    """Where a critic request puts the prompt and the runs (``pattern``, groups ``template`` and
    ``runs``), where each run starts (``run``), and a run's reward (``reward``: no match or an
    empty group is a run without a reward, which counts as a failure)."""

    name: str
    pattern: re.Pattern[str]
    run: re.Pattern[str]
    reward: re.Pattern[str]


_NUMBER = r"(?P<reward>-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)?"
_CRITICS = (
    _Critic(
        "fulgor",
        re.compile(_FULGOR_PROMPT + r"(?P<runs>.*)", re.S),
        re.compile(r"<rollout\b"),
        re.compile(rf'^[^>]*\breward="{_NUMBER}', re.I),
    ),
    _Critic(
        "agl text_gradient_variant01",
        _between("# Original Prompt Template", "# Experiments with Original Prompt Template", "runs"),
        re.compile(r"^## Experiment \d+$", re.M),
        re.compile(rf"final reward:[ \t]*{_NUMBER}"),
    ),
    _Critic(
        "agl text_gradient_variant02",
        _between("# Current Prompt Template", "# Sample Runs with Current Prompt Template", "runs"),
        re.compile(r"^## Sample Run #\d+ Diagnostics$", re.M),
        re.compile(rf'"(?:agentlightning\.reward\.0|fulgor\.reward)\.value":\s*{_NUMBER}'),
    ),
    _Critic(
        "agl text_gradient_variant03",
        _between("# Prompt", "# Sample Runs of the Prompts (Historical Messages and Rewards)", "runs"),
        re.compile(r"^## Sample Run #\d+$", re.M),
        re.compile(rf"final score is[ \t]*{_NUMBER}"),
    ),
)


@dataclass(frozen=True)
class OptimizerRequest:
    """What the optimiser's model read off a request: its format, the prompt, and the critique (an
    editor's request) or whether a run shown fell short (a critic's)."""

    format: str
    template: str
    critique: str | None = None
    failed: bool = False


def read_request(text: str) -> OptimizerRequest | None:
    """The request in ``text`` (the last user message), or None when it is in no known format."""
    for name, pattern in _EDITORS:
        match = pattern.search(text)
        if match is not None:
            return OptimizerRequest(f"{name} editor", match["template"], critique=match["critique"])
    for critic in _CRITICS:
        match = critic.pattern.search(text)
        if match is not None:
            failed = _any_failed(critic, match["runs"])
            return OptimizerRequest(f"{critic.name} critic", match["template"], failed=failed)
    return None


def _any_failed(critic: _Critic, runs: str) -> bool:
    """Whether a run shown has a reward below 1, or none at all."""
    for section in critic.run.split(runs)[1:]:
        found = critic.reward.search(section)
        if found is None or found["reward"] is None or float(found["reward"]) < 1.0:
            return True
    return False


def edit(template: str, critique: str) -> str:
    """``template`` with each rule sentence the critique names and the template lacks appended,
    one a line; placeholders untouched.

    >>> edit("Book {date}.", "- " + RULE_SENTENCES["distance"])
    'Book {date}.\\nThen prefer the closest room.'
    >>> edit("Book {date}.", "- Be concise.")
    'Book {date}.'
    """
    lowered, wanted = template.lower(), critique.lower()
    added = [s for s in RULE_SENTENCES.values() if s.lower() in wanted and s.lower() not in lowered]
    if not added:
        return template
    return "\n".join([template.rstrip("\n"), *added])


class RoomsOptimizer:
    """The simulated critic and editor of prompt optimisation (a responder); see the module docstring.

    The critique is drawn from ``random.Random`` seeded with ``seed`` and a hash of the request,
    so one request always gets one critique and requests with other rollouts get others.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.critic_calls = 0
        self.editor_calls = 0

    def __call__(self, body: JsonDict) -> ScriptedReply:
        users = _messages(body, "user")
        text = users[-1] if users else ""
        request = read_request(text)
        if request is None:
            return ScriptedReply(text="I found no prompt in the request to work on.")
        if request.critique is not None:
            self.editor_calls += 1
            return ScriptedReply(text=edit(request.template, request.critique))
        self.critic_calls += 1
        return ScriptedReply(text=self.critique(request, text))

    def critique(self, request: OptimizerRequest, text: str) -> str:
        """One or two bullets, each a rule sentence the prompt lacks; "- No change needed." when it
        lacks none or no run shown failed."""
        missing = [rule for rule in RULE_SENTENCES if rule not in stated_rules(request.template)]
        if not missing or not request.failed:
            return NO_CHANGE
        digest = hashlib.sha256(text.encode()).hexdigest()
        rng = random.Random(f"{self.seed}:{digest}")
        picked = rng.sample(missing, rng.randint(1, min(2, len(missing))))
        return "\n".join(f"- {RULE_SENTENCES[rule]}" for rule in sorted(picked, key=missing.index))


def simulated_rooms_model(**kwargs: Any) -> ScriptedOpenAIServer:
    """A scripted server answered by :class:`RoomsModel` (model name "rooms-sim")."""
    kwargs.setdefault("model", "rooms-sim")
    return ScriptedOpenAIServer(responder=RoomsModel(), **kwargs)


def simulated_optimizer(seed: int = 0, **kwargs: Any) -> ScriptedOpenAIServer:
    """A scripted server answered by :class:`RoomsOptimizer` (model name "optimizer-sim"); its
    ``responder`` is the optimiser, with the call counters."""
    kwargs.setdefault("model", "optimizer-sim")
    return ScriptedOpenAIServer(responder=RoomsOptimizer(seed), **kwargs)
