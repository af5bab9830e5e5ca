"""The rooms example: the booking rule and its feedback, the tasks, the tool, and the agent end to
end over real HTTP against the simulated rooms model."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from examples.rooms import dataset
from examples.rooms.agent import SEED_PROMPT, SEED_SYSTEM_PROMPT, room_agent
from examples.rooms.dataset import ROOMS, make_splits, make_tasks, rooms_on
from examples.rooms.rules import RoomRecord, decisive_rule, expected_room, grade, parse_answer
from examples.rooms.tools import list_rooms
from fulgor import LLM, PromptTemplate, RolloutRequest, semconv
from fulgor.runner import Runner, RunnerConfig
from fulgor.store import MemoryStore
from fulgor.testing import simulated_rooms_model
from fulgor.testing.rooms import RULE_SENTENCES

ALL_RULES = PromptTemplate(template="\n".join([SEED_PROMPT.template, *RULE_SENTENCES.values()]))


# -- the rule and its feedback ----------------------------------------------------------------------


def room(
    name: str, capacity: int = 10, equipment: tuple[str, ...] = ("projector",), **extra: Any
) -> RoomRecord:
    fields: dict[str, Any] = {"accessible": True, "distance_m": 20, "bookings": ["08:00-09:00"], **extra}
    return RoomRecord(name=name, capacity=capacity, equipment=list(equipment), **fields)


# Best qualifies and wins; each other room loses to it by exactly one rule.
WORLD = [
    room("Best"),
    room("Small", capacity=6),
    room("Bare", equipment=()),
    room("Stairs", accessible=False),
    room("Busy", bookings=["10:30-11:30"]),
    room("Roomy", capacity=14),
    room("Loaded", equipment=("projector", "video"), distance_m=10),
    room("Far", distance_m=80),
    room("Busier", bookings=["08:00-09:00", "14:00-15:00"]),
]
MEETING: dict[str, Any] = {
    "id": "t",
    "date": "2025-03-03",
    "time": "10:00",
    "duration_minutes": 60,
    "attendees": 8,
    "needs": ["projector"],
    "accessible": True,
}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset, "rooms_on", lambda date: [dict(r) for r in WORLD])


@pytest.mark.usefixtures("world")
@pytest.mark.parametrize(
    ("answer", "feedback"),
    [
        ("Best", "correct: Best"),
        ("I would book best.", "correct: Best"),
        ("Small", "expected Best, got Small: Small seats 6, fewer than the 8 attendees"),
        ("Bare", "expected Best, got Bare: Bare lacks the projector"),
        ("Stairs", "expected Best, got Stairs: Stairs is not accessible"),
        ("Busy", "expected Best, got Busy: Busy is booked 10:30-11:30"),
        ("Roomy", "expected Best, got Roomy: Best leaves fewer seats spare (2 vs 6)"),
        (
            "Loaded",
            "expected Best, got Loaded: Best has less equipment the meeting does not need (0 vs 1 items)",
        ),
        ("Far", "expected Best, got Far: Best is closer (20 m vs 80 m)"),
        ("Busier", "expected Best, got Busier: Best has fewer bookings that day (1 vs 2)"),
        ("No Room", "expected Best, got No Room: Best meets every constraint"),
        ("I am not sure.", "expected Best, got no room name: answer with the name of one room, or No Room"),
        ("Far or Small", "expected Best, got several rooms (Far, Small): name one room, or No Room"),
    ],
)
def test_feedback_names_the_first_rule_that_separates_the_answer_from_the_expected_room(
    answer: str, feedback: str
) -> None:
    assert grade(answer, MEETING) == (1.0 if feedback.startswith("correct") else 0.0, feedback)


@pytest.mark.usefixtures("world")
def test_no_room_is_expected_when_no_room_meets_every_constraint() -> None:
    crowd = {**MEETING, "attendees": 30}
    assert expected_room(crowd, WORLD) == "No Room"
    assert grade("no room", crowd) == (1.0, "correct: No Room")
    assert grade("Roomy", crowd) == (
        0.0,
        "expected No Room, got Roomy: no room meets every constraint "
        "(Roomy seats 14, fewer than the 30 attendees)",
    )


def test_the_tie_breaks_apply_in_order() -> None:
    # Roomy would win on distance, bookings and extra equipment, but spare capacity comes first.
    rooms = [room("Roomy", capacity=14, equipment=("projector",), distance_m=5, bookings=[]), room("Tight")]
    assert expected_room(MEETING, rooms) == "Tight"
    rooms = [room("Near", equipment=("projector", "phone"), distance_m=5), room("Plain", distance_m=90)]
    assert expected_room(MEETING, rooms) == "Plain"


def test_answers_naming_several_rooms_count_by_their_last_line() -> None:
    assert parse_answer("Aspen is booked.\nBook Birch.", list(ROOMS)) == "Birch"
    assert parse_answer("Aspen, Birch", list(ROOMS)) is None
    assert parse_answer(None, list(ROOMS)) is None


# -- the tasks --------------------------------------------------------------------------------------


def test_tasks_are_deterministic_json_and_answered_by_the_rule() -> None:
    tasks = make_tasks()
    assert len(tasks) == 60
    assert make_tasks() == tasks
    assert make_tasks(seed=1) != tasks
    assert json.loads(json.dumps(tasks)) == tasks
    assert len({t["id"] for t in tasks}) == 60
    for task in tasks:
        assert set(task) == {
            "id",
            "date",
            "time",
            "duration_minutes",
            "attendees",
            "needs",
            "accessible",
            "answer",
        }
        assert task["answer"] == expected_room(task, rooms_on(task["date"]))
        assert set(task["needs"]) <= set(dataset.EQUIPMENT)


def test_splits_are_disjoint_halves_with_the_same_mix_of_deciding_rules() -> None:
    train, val = make_splits()
    assert (len(train), len(val)) == (30, 30)
    assert make_splits() == (train, val)
    assert not {t["id"] for t in train} & {t["id"] for t in val}
    mix = [Counter(decisive_rule(t, rooms_on(t["date"])) for t in split) for split in (train, val)]
    assert mix[0] == mix[1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_rule_decides_a_good_share_and_about_one_in_eight_is_no_room(seed: int) -> None:
    tasks = make_tasks(seed=seed)
    deciding = Counter(decisive_rule(t, rooms_on(t["date"])) for t in tasks)
    assert set(deciding) == {"no_room", "hard", "spare", "extra", "distance", "bookings"}  # never a full tie
    assert min(deciding.values()) >= 8
    no_room = sum(t["answer"] == "No Room" for t in tasks) / len(tasks)
    assert 0.10 <= no_room <= 0.15


def test_the_world_has_distinct_distances_but_for_the_twin_rooms() -> None:
    rooms = rooms_on(dataset.DATES[0])
    assert 10 <= len(rooms) <= 12
    by_distance = Counter(r["distance_m"] for r in rooms)
    twins = [
        sorted(r["name"] for r in rooms if r["distance_m"] == d) for d, n in by_distance.items() if n > 1
    ]
    assert sorted(twins) == [["Cedar", "Elm"], ["Maple", "Oak"]]
    for pair in twins:
        first, second = (next(r for r in rooms if r["name"] == name) for name in pair)
        assert first["capacity"] == second["capacity"]
        assert len(first["equipment"]) == len(second["equipment"])


def test_the_tool_lists_every_room_in_an_order_shuffled_per_task() -> None:
    tasks = make_tasks()
    listings = [json.loads(list_rooms(t["date"], t["time"], t["id"])) for t in tasks]
    for task, listing in zip(tasks, listings, strict=True):
        assert sorted(listing, key=lambda r: r["name"]) == rooms_on(task["date"])
    firsts = Counter(listing[0]["name"] for listing in listings)
    assert len(firsts) >= 6
    assert max(firsts.values()) <= 15
    first_right = sum(listing[0]["name"] == t["answer"] for t, listing in zip(tasks, listings, strict=True))
    assert first_right / len(tasks) <= 0.25


# -- the agent, over HTTP ---------------------------------------------------------------------------


async def run_agent(
    tasks: list[dict[str, Any]], resources: dict[str, Any]
) -> tuple[list[tuple[float, str]], list[dict[str, Any]]]:
    """Run ``room_agent`` on ``tasks`` through a runner against the simulated rooms model; the
    (reward, feedback) of each and the requests the model got."""
    async with simulated_rooms_model() as server:
        store = MemoryStore()
        await store.put_resources({"llm": LLM(endpoint=server.url, model="gpt-4.1-mini"), **resources})
        created = await store.enqueue([RolloutRequest(input=task) for task in tasks])
        runner = Runner(room_agent, store, config=RunnerConfig(claim_wait_seconds=0.2))
        running = asyncio.create_task(runner.run())
        done = await store.wait([r.rollout_id for r in created], timeout_seconds=30)
        runner.stop()
        await running
        assert [r.status for r in done] == ["succeeded"] * len(tasks)
        results = []
        for rollout in created:
            [span] = await store.query_spans(rollout.rollout_id, name=semconv.SPAN_REWARD)
            attributes = span.attributes
            results.append((attributes[semconv.ATTR_REWARD_VALUE], attributes[semconv.ATTR_REWARD_FEEDBACK]))
        await store.close()
        return results, server.requests


async def test_the_agent_books_by_the_rules_its_prompts_state() -> None:
    tasks = make_tasks()[:6]
    results, requests = await run_agent(
        tasks, {"prompt_template": ALL_RULES, "system_prompt": SEED_SYSTEM_PROMPT}
    )
    assert results == [(1.0, f"correct: {t['answer']}") for t in tasks]
    assert len(requests) == 2 * len(tasks)  # list the rooms, then answer
    first = requests[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][0]["content"] == SEED_SYSTEM_PROMPT.template
    assert first["tools"][0]["function"]["name"] == "list_rooms"
    assert requests[1]["messages"][-1]["role"] == "tool"


async def test_the_agent_runs_with_its_user_prompt_alone_and_reports_the_feedback() -> None:
    tasks = make_tasks()[:6]
    results, requests = await run_agent(tasks, {"prompt_template": SEED_PROMPT})
    assert [m["role"] for m in requests[0]["messages"]] == ["user"]
    assert "Attendees: " in requests[0]["messages"][0]["content"]
    for task, (reward, feedback) in zip(tasks, results, strict=True):
        expected = f"correct: {task['answer']}" if reward == 1.0 else f"expected {task['answer']}, got "
        assert feedback.startswith(expected)
    assert sum(reward for reward, _ in results) < len(tasks)
