"""The rooms task's tool and conversation, without fulgor: what any harness of the room agent runs.

``list_rooms`` is the tool (every room with the day's bookings, in an order shuffled per task),
``run_tool`` answers a model's tool call with it, ``prompt_fields`` fills a prompt template's
placeholders from a task, and ``converse`` is the agent's loop: up to ``MAX_TURNS`` chat calls
with ``ROOMS_TOOL`` offered, each tool call answered, until the model answers in text. The fulgor
agent (:mod:`examples.rooms.agent`) and the Agent Lightning side of the APO benchmark both run it,
so that the two send the same requests.
"""

from __future__ import annotations

import json
import random
from typing import Any

from examples.rooms.dataset import DATES, rooms_on

__all__ = ["MAX_TURNS", "ROOMS_TOOL", "converse", "list_rooms", "prompt_fields", "run_tool"]

ROOMS_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "list_rooms",
        "description": "Every meeting room with its seats, equipment, accessibility, distance and bookings.",
        "parameters": {
            "type": "object",
            "properties": {
                "date": {"type": "string", "description": "YYYY-MM-DD"},
                "time": {"type": "string", "description": "the meeting's start, HH:MM"},
            },
            "required": ["date", "time"],
        },
    },
}
MAX_TURNS = 4


def list_rooms(date: str, time: str, order_key: str = "") -> str:
    """The tool: every room with its bookings on ``date``, as JSON, in an order shuffled by
    ``order_key`` (the task's id), so that no position in the list is a strategy. ``time`` is
    the meeting's start as the model gives it; the list covers the whole day.

    >>> rooms = json.loads(list_rooms("2025-03-03", "09:00", "rooms-0-1"))
    >>> len(rooms), sorted(rooms[0])
    (11, ['accessible', 'bookings', 'capacity', 'distance_m', 'equipment', 'name'])
    >>> list_rooms("2025-03-03", "09:00", "a") == list_rooms("2025-03-03", "09:00", "a")
    True
    >>> list_rooms("2031-01-01", "09:00")
    'error: no bookings are kept for 2031-01-01; dates run from 2025-03-03 to 2025-03-14'
    """
    if date not in DATES:
        return f"error: no bookings are kept for {date}; dates run from {DATES[0]} to {DATES[-1]}"
    rooms = rooms_on(date)
    random.Random(f"rooms-order:{order_key}").shuffle(rooms)
    return json.dumps(rooms)


def run_tool(name: str | None, arguments: str | None, order_key: str) -> str:
    """What a tool call of the model gets back: the room list, or an error as text.

    >>> run_tool("book", "{}", "a"), run_tool("list_rooms", "{}", "a")
    ("error: unknown tool 'book'", 'error: call list_rooms with {"date": "YYYY-MM-DD", "time": "HH:MM"}')
    """
    if name != "list_rooms":
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(arguments or "{}")
        date, time = str(args["date"]), str(args.get("time", ""))
    except (json.JSONDecodeError, KeyError, TypeError):
        return 'error: call list_rooms with {"date": "YYYY-MM-DD", "time": "HH:MM"}'
    return list_rooms(date, time, order_key)


def prompt_fields(task: dict[str, Any]) -> dict[str, str]:
    """The values of the prompt's placeholders.

    >>> prompt_fields({"date": "2025-03-03", "time": "09:00", "duration_minutes": 60, "attendees": 4,
    ...                "needs": ["projector", "video"], "accessible": False})["needs"]
    'projector, video'
    """
    return {
        "date": task["date"],
        "time": task["time"],
        "duration_minutes": str(task["duration_minutes"]),
        "attendees": str(task["attendees"]),
        "needs": ", ".join(task["needs"]) or "none",
        "accessible": "yes" if task["accessible"] else "no",
    }


async def converse(
    client: Any, model: str, messages: list[dict[str, Any]], order_key: str, **sampling: Any
) -> str | None:
    """The model's final text (None when it never gave one), answering its tool calls meanwhile;
    ``client`` is an ``openai.AsyncOpenAI``, ``sampling`` its sampling parameters."""
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=[ROOMS_TOOL], **sampling
        )
        message = response.choices[0].message
        if not message.tool_calls:
            content: str | None = message.content
            return content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            function = getattr(call, "function", None)  # a custom tool call has none
            name, arguments = (function.name, function.arguments) if function else (None, None)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": run_tool(name, arguments, order_key)}
            )
    return None
