"""The rooms world (eleven meeting rooms, their bookings on ten dates) and the booking tasks.

The world is fixed: the rooms never change, and each date's bookings are generated from the date
alone, so the ``list_rooms`` tool and the grade see the same day as the task's generator did.
Distances are distinct except for two pairs of twin rooms (same seats, same amount of equipment,
side by side): only between twins can the last tie-break, the day's bookings, decide, and the
generator never keeps a task whose twins tie on that too.

A task is ``{"id", "date", "time", "duration_minutes", "attendees", "needs", "accessible",
"answer"}``, JSON-able. The generator draws meetings until each has the deciding rule its slot asks
for (no room at all, one room only, or one of the tie-breaks), so every rule decides a good share
of the tasks, and about one task in eight has the answer "No Room". The same seed always gives
the same tasks; the two splits have the same mix.

    python -m examples.rooms.dataset        # prints each task with what decides it
"""

from __future__ import annotations

import datetime
import random
from typing import Any

from examples.rooms.rules import RoomRecord, decisive_rule, expected_room

__all__ = ["DATES", "EQUIPMENT", "ROOMS", "Task", "bookings_on", "make_splits", "make_tasks", "rooms_on"]

Task = dict[str, Any]

EQUIPMENT = ("projector", "whiteboard", "video", "phone", "screen")

# name, seats, equipment, accessible, distance in metres
_ROOMS: list[tuple[str, int, tuple[str, ...], bool, int]] = [
    ("Aspen", 4, ("whiteboard",), True, 35),
    ("Birch", 4, ("screen",), False, 10),
    ("Cedar", 6, ("projector", "whiteboard"), True, 40),
    ("Elm", 6, ("whiteboard", "screen"), True, 40),
    ("Fir", 6, ("phone",), False, 45),
    ("Hazel", 8, ("projector", "whiteboard", "phone"), False, 30),
    ("Larch", 8, ("video", "screen", "phone"), True, 60),
    ("Maple", 12, ("video", "phone", "screen"), True, 70),
    ("Oak", 12, ("video", "phone", "whiteboard"), True, 70),
    ("Pine", 12, ("video", "phone"), False, 85),
    ("Willow", 20, ("projector", "video", "phone", "screen"), True, 110),
]
ROOMS: tuple[str, ...] = tuple(name for name, *_ in _ROOMS)

DATES: tuple[str, ...] = tuple(
    str(datetime.date(2025, 3, 3) + datetime.timedelta(days=d)) for d in range(14) if d % 7 < 5
)

_DAY_START, _DAY_END = 8 * 60, 18 * 60
_DURATIONS = (30, 45, 60, 90, 120)
# The deciding rule of each pair of tasks (one for each split), 30 pairs: No Room in 4 of them.
_SCHEDULE = ["no_room"] * 4 + ["hard"] * 5 + ["spare"] * 6 + ["extra"] * 5 + ["distance"] * 5
_SCHEDULE += ["bookings"] * 5
_MAX_DRAWS = 20_000


def _clock(total: int) -> str:
    return f"{total // 60:02d}:{total % 60:02d}"


def bookings_on(date: str) -> dict[str, list[str]]:
    """Each room's bookings on ``date`` (``"09:00-10:30"``, sorted), the same on every call.

    >>> bookings_on("2025-03-03") == bookings_on("2025-03-03")
    True
    """
    rng = random.Random(f"rooms-bookings:{date}")
    day: dict[str, list[str]] = {}
    for name in ROOMS:
        taken: list[tuple[int, int]] = []
        for _ in range(rng.choice((0, 1, 2, 2, 3, 3, 4))):
            start = _DAY_START + 30 * rng.randrange(19)
            end = min(_DAY_END, start + 30 * rng.randint(1, 4))
            if all(end <= a or b <= start for a, b in taken):
                taken.append((start, end))
        day[name] = [f"{_clock(a)}-{_clock(b)}" for a, b in sorted(taken)]
    return day


def rooms_on(date: str) -> list[RoomRecord]:
    """Every room, in the world's order, with its bookings on ``date``."""
    day = bookings_on(date)
    return [
        RoomRecord(
            name=name,
            capacity=seats,
            equipment=list(equipment),
            accessible=accessible,
            distance_m=distance,
            bookings=day[name],
        )
        for name, seats, equipment, accessible, distance in _ROOMS
    ]


def _draw_meeting(rng: random.Random) -> Task:
    duration = rng.choice(_DURATIONS)
    start = _DAY_START + 30 * rng.randrange((_DAY_END - _DAY_START - duration) // 30 + 1)
    return {
        "date": rng.choice(DATES),
        "time": _clock(start),
        "duration_minutes": duration,
        "attendees": rng.choice((2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18)),
        "needs": sorted(rng.sample(EQUIPMENT, rng.choice((0, 0, 1, 1, 1, 2)))),
        "accessible": rng.random() < 0.4,
    }


def _meeting_for(rule: str, rng: random.Random, seen: set[str]) -> Task:
    """Draw meetings until one is decided by ``rule`` and is new."""
    for _ in range(_MAX_DRAWS):
        meeting = _draw_meeting(rng)
        key = repr(sorted(meeting.items()))
        if key not in seen and decisive_rule(meeting, rooms_on(meeting["date"])) == rule:
            seen.add(key)
            return meeting
    raise RuntimeError(f"no meeting decided by {rule!r} in {_MAX_DRAWS} draws")


def make_tasks(n: int = 60, seed: int = 0) -> list[Task]:
    """``n`` tasks; tasks ``2k`` and ``2k+1`` share their deciding rule (see the module docstring).

    >>> tasks = make_tasks(4, seed=1)
    >>> [t["id"] for t in tasks], tasks == make_tasks(4, seed=1)
    (['rooms-1-0', 'rooms-1-1', 'rooms-1-2', 'rooms-1-3'], True)
    """
    rng = random.Random(seed)
    schedule = list(_SCHEDULE)
    rng.shuffle(schedule)
    seen: set[str] = set()
    tasks: list[Task] = []
    for index in range(n):
        meeting = _meeting_for(schedule[(index // 2) % len(schedule)], rng, seen)
        answer = expected_room(meeting, rooms_on(meeting["date"]))
        tasks.append({"id": f"rooms-{seed}-{index}", **meeting, "answer": answer})
    return tasks


def make_splits(seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(train, val): 30 tasks each, the even and the odd ones of :func:`make_tasks`, with the same
    mix of deciding rules.

    >>> train, val = make_splits()
    >>> len(train), len(val), {t["id"] for t in train} & {t["id"] for t in val}
    (30, 30, set())
    """
    tasks = make_tasks(60, seed)
    return tasks[0::2], tasks[1::2]


def main() -> int:
    for task in make_tasks():
        rule = decisive_rule(task, rooms_on(task["date"]))
        print(f"{task['id']:>11}  {rule:<8}  {task['answer']:<8}  {task}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
