"""The room-booking rule, and the grade of an answer against it.

A room qualifies when it meets every hard constraint, checked in this order: it seats every
attendee, has all the equipment the meeting needs, is accessible when the meeting needs that, and
has no booking overlapping the meeting. With no room left the answer is "No Room"; otherwise the
tie-breaks choose, in order: least spare capacity, least extra equipment (equipment the meeting
does not need), shortest distance, fewest bookings that day (and then the name, so the rule always
gives one answer; the generated tasks never come to that).

The grade's feedback says in plain words what was expected and which rule the answer broke.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

__all__ = [
    "NO_ROOM",
    "TIE_BREAKS",
    "RoomRecord",
    "decisive_rule",
    "expected_room",
    "grade",
    "mentioned_rooms",
    "parse_answer",
    "violation",
]

NO_ROOM = "No Room"
TIE_BREAKS = ("spare", "extra", "distance", "bookings")


class RoomRecord(TypedDict):
    """One room as the ``list_rooms`` tool shows it, with its bookings on one date."""

    name: str
    capacity: int
    equipment: list[str]
    accessible: bool
    distance_m: int
    bookings: list[str]


Meeting = dict[str, Any]


def minutes(clock: str) -> int:
    """Minutes since midnight of an ``HH:MM`` time.

    >>> minutes("09:30")
    570
    """
    hours, mins = clock.split(":")
    return int(hours) * 60 + int(mins)


def overlapping_booking(room: RoomRecord, meeting: Meeting) -> str | None:
    """The first booking of ``room`` that overlaps [time, time + duration), or None."""
    start = minutes(meeting["time"])
    end = start + int(meeting["duration_minutes"])
    for booking in room["bookings"]:
        first, last = booking.split("-")
        if minutes(first) < end and start < minutes(last):
            return booking
    return None


def violation(room: RoomRecord, meeting: Meeting) -> str | None:
    """The first hard constraint ``room`` breaks for ``meeting``, in words; None when it qualifies.

    >>> room = RoomRecord(name="Aspen", capacity=6, equipment=["whiteboard"], accessible=False,
    ...                   distance_m=20, bookings=["10:00-11:00"])
    >>> meeting = {"time": "10:30", "duration_minutes": 30, "attendees": 4, "needs": [], "accessible": False}
    >>> violation(room, {**meeting, "attendees": 8})
    'Aspen seats 6, fewer than the 8 attendees'
    >>> violation(room, {**meeting, "needs": ["projector", "video"]})
    'Aspen lacks the projector and video'
    >>> violation(room, {**meeting, "accessible": True})
    'Aspen is not accessible'
    >>> violation(room, meeting)
    'Aspen is booked 10:00-11:00'
    >>> violation(room, {**meeting, "time": "11:00"}) is None
    True
    """
    name = room["name"]
    if room["capacity"] < meeting["attendees"]:
        return f"{name} seats {room['capacity']}, fewer than the {meeting['attendees']} attendees"
    missing = [item for item in meeting["needs"] if item not in room["equipment"]]
    if missing:
        return f"{name} lacks the {' and '.join(missing)}"
    if meeting["accessible"] and not room["accessible"]:
        return f"{name} is not accessible"
    booking = overlapping_booking(room, meeting)
    return None if booking is None else f"{name} is booked {booking}"


def preference(room: RoomRecord, meeting: Meeting) -> tuple[int, int, int, int]:
    """The tie-break values of a qualifying room, lowest best, in :data:`TIE_BREAKS` order."""
    extra = len(set(room["equipment"]) - set(meeting["needs"]))
    spare = room["capacity"] - meeting["attendees"]
    return (spare, extra, room["distance_m"], len(room["bookings"]))


def ranked(meeting: Meeting, rooms: list[RoomRecord]) -> list[RoomRecord]:
    """The qualifying rooms, best first."""
    fitting = [room for room in rooms if violation(room, meeting) is None]
    return sorted(fitting, key=lambda room: (preference(room, meeting), room["name"]))


def expected_room(meeting: Meeting, rooms: list[RoomRecord]) -> str:
    """The room the rule books for ``meeting`` (a task or its meeting fields), or "No Room".

    >>> def room(name, capacity, distance, equipment=(), bookings=()):
    ...     return RoomRecord(name=name, capacity=capacity, equipment=list(equipment), accessible=True,
    ...                       distance_m=distance, bookings=list(bookings))
    >>> meeting = {"time": "09:00", "duration_minutes": 60, "attendees": 5, "needs": [], "accessible": False}
    >>> expected_room(meeting, [room("Aspen", 8, 10), room("Birch", 6, 50)])  # least spare capacity
    'Birch'
    >>> expected_room(meeting, [room("Aspen", 6, 10, ["phone"]), room("Birch", 6, 50)])  # least extra
    'Birch'
    >>> expected_room(meeting, [room("Aspen", 6, 10), room("Birch", 6, 50)])  # shortest distance
    'Aspen'
    >>> expected_room(meeting, [room("Aspen", 6, 10, bookings=["13:00-14:00"]), room("Birch", 6, 10)])
    'Birch'
    >>> expected_room(meeting, [room("Aspen", 4, 10), room("Birch", 6, 50, bookings=["09:30-10:00"])])
    'No Room'
    """
    best = ranked(meeting, rooms)
    return best[0]["name"] if best else NO_ROOM


def decisive_rule(meeting: Meeting, rooms: list[RoomRecord]) -> str:
    """What decides the answer: "no_room", "hard" (one room qualifies), the tie-break that puts the
    best room ahead of the runner-up, or "name" (a full tie)."""
    best = ranked(meeting, rooms)
    if not best:
        return "no_room"
    if len(best) == 1:
        return "hard"
    first, second = preference(best[0], meeting), preference(best[1], meeting)
    return next((TIE_BREAKS[i] for i in range(len(TIE_BREAKS)) if first[i] != second[i]), "name")


def mentioned_rooms(text: str, names: list[str]) -> list[str]:
    """The room names (and "No Room") ``text`` mentions, in the order they first appear."""
    found: list[tuple[int, str]] = []
    for name in [*names, NO_ROOM]:
        pattern = r"\bno rooms?\b" if name == NO_ROOM else rf"\b{re.escape(name)}\b"
        match = re.search(pattern, text, re.IGNORECASE)
        if match:
            found.append((match.start(), name))
    return [name for _, name in sorted(found)]


def parse_answer(text: str | None, names: list[str]) -> str | None:
    """The one room (or "No Room") the answer names; when it names several, the one its last line
    names; None when that is still not exactly one.

    >>> names = ["Aspen", "Birch"]
    >>> parse_answer("I would book birch.", names), parse_answer("no room is free", names)
    ('Birch', 'No Room')
    >>> parse_answer("Aspen is too small.\\nAnswer: Birch", names), parse_answer("Aspen or Birch", names)
    ('Birch', None)
    """
    if not text:
        return None
    named = mentioned_rooms(text, names)
    if len(named) == 1:
        return named[0]
    lines = [line for line in text.splitlines() if line.strip()]
    last = mentioned_rooms(lines[-1], names) if lines else []
    return last[0] if len(last) == 1 else None


def grade(answer_text: str | None, task: Meeting) -> tuple[float, str]:
    """1.0 when the answer names exactly the expected room, else 0.0; and feedback in words.

    >>> task = {"date": "2025-03-03", "time": "09:00", "duration_minutes": 60, "attendees": 3,
    ...         "needs": ["projector"], "accessible": False}
    >>> task["answer"] = expected_room(task, rooms_for(task))
    >>> grade(task["answer"], task)
    (1.0, 'correct: Cedar')
    >>> grade("Aspen", task)
    (0.0, 'expected Cedar, got Aspen: Aspen lacks the projector')
    >>> grade("Willow", task)
    (0.0, 'expected Cedar, got Willow: Cedar leaves fewer seats spare (3 vs 17)')
    """
    rooms = rooms_for(task)
    expected = expected_room(task, rooms)
    names = [room["name"] for room in rooms]
    answer = parse_answer(answer_text, names)
    if answer == expected:
        return 1.0, f"correct: {expected}"
    return 0.0, f"expected {expected}, got {_reason(answer, answer_text, expected, task, rooms)}"


def rooms_for(task: Meeting) -> list[RoomRecord]:
    """Every room with its bookings on the task's date."""
    # Imported here: the dataset imports this module to compute each task's answer.
    from examples.rooms.dataset import rooms_on

    return rooms_on(task["date"])


def _reason(
    answer: str | None, text: str | None, expected: str, meeting: Meeting, rooms: list[RoomRecord]
) -> str:
    """What the wrong answer was and why it is wrong (after "expected X, got ")."""
    by_name = {room["name"]: room for room in rooms}
    if answer is None:
        named = mentioned_rooms(text or "", list(by_name))
        if named:
            return f"several rooms ({', '.join(named)}): name one room, or No Room"
        return "no room name: answer with the name of one room, or No Room"
    if answer == NO_ROOM:
        return f"No Room: {expected} meets every constraint"
    broken = violation(by_name[answer], meeting)
    if expected == NO_ROOM:
        return f"{answer}: no room meets every constraint ({broken})"
    if broken is not None:
        return f"{answer}: {broken}"
    return f"{answer}: {_preferred(by_name[expected], by_name[answer], meeting)}"


def _preferred(best: RoomRecord, other: RoomRecord, meeting: Meeting) -> str:
    """The first tie-break that puts ``best`` ahead of ``other`` (both qualify), in words."""
    mine, theirs = preference(best, meeting), preference(other, meeting)
    name = best["name"]
    if mine[0] != theirs[0]:
        return f"{name} leaves fewer seats spare ({mine[0]} vs {theirs[0]})"
    if mine[1] != theirs[1]:
        return f"{name} has less equipment the meeting does not need ({mine[1]} vs {theirs[1]} items)"
    if mine[2] != theirs[2]:
        return f"{name} is closer ({mine[2]} m vs {theirs[2]} m)"
    if mine[3] != theirs[3]:
        return f"{name} has fewer bookings that day ({mine[3]} vs {theirs[3]})"
    return f"{name} and {other['name']} tie on every rule, and {name} comes first by name"
