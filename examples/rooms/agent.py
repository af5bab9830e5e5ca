"""The room agent, written with the plain ``openai`` SDK: read the meeting, list the rooms, book one.

Its prompts are resources: ``prompt_template`` (the user message, with the meeting's fields as
placeholders) and, when given, ``system_prompt``. The seed prompts ask for a room and say how to
answer, but state none of the booking rules (:mod:`examples.rooms.rules`): prompt optimisation
has to find them from the grade's feedback. With ``prompt_template`` alone the agent sends no
system message, so the same agent serves one-prompt and two-prompt optimisation.
"""

from __future__ import annotations

import json
import random
from typing import Any

from openai import AsyncOpenAI

from examples.rooms.dataset import DATES, rooms_on
from examples.rooms.rules import grade
from fulgor import LLM, PromptTemplate, emit_reward, rollout

__all__ = [
    "MAX_TURNS",
    "ROOMS_TOOL",
    "SEED_PROMPT",
    "SEED_SYSTEM_PROMPT",
    "first_messages",
    "list_rooms",
    "prompt_fields",
    "room_agent",
    "run_tool",
]

SEED_PROMPT = PromptTemplate(
    template=(
        "Book a meeting room for this meeting.\n"
        "Date: {date}\n"
        "Start: {time}\n"
        "Length: {duration_minutes} minutes\n"
        "Attendees: {attendees}\n"
        "Needs: {needs}\n"
        "Wheelchair access: {accessible}\n"
        "Look the rooms up with the list_rooms tool, then reply with only the name of the room "
        "to book, or No Room if there is none."
    )
)
SEED_SYSTEM_PROMPT = PromptTemplate(
    template="You book meeting rooms for an office. Use the tool you are given."
)
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


def first_messages(
    task: dict[str, Any], prompt_template: PromptTemplate, system_prompt: PromptTemplate | None = None
) -> list[dict[str, Any]]:
    """The conversation the model first sees: the system prompt (when given), then the meeting."""
    user = {"role": "user", "content": prompt_template.format(**prompt_fields(task))}
    if system_prompt is None:
        return [user]
    return [{"role": "system", "content": system_prompt.format()}, user]


@rollout
async def room_agent(
    task: dict[str, Any],
    llm: LLM,
    prompt_template: PromptTemplate,
    system_prompt: PromptTemplate | None = None,
) -> None:
    """One booking: up to MAX_TURNS model calls, tool calls answered by ``list_rooms``; the final
    text is graded and the reward reported with the grade's feedback."""
    messages = first_messages(task, prompt_template, system_prompt)
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=2) as client:
        final = await _converse(client, llm, messages, str(task["id"]))
    reward, feedback = grade(final, task)
    emit_reward(reward, feedback=feedback)


async def _converse(
    client: AsyncOpenAI, llm: LLM, messages: list[dict[str, Any]], order_key: str
) -> str | None:
    """The model's final text (None when it never gave one), answering its tool calls meanwhile."""
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model=llm.model,
            messages=messages,  # type: ignore[arg-type]
            tools=[ROOMS_TOOL],  # type: ignore[list-item]
            **llm.sampling_parameters,
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            function = getattr(call, "function", None)  # a custom tool call has none
            name, arguments = (function.name, function.arguments) if function else (None, None)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": run_tool(name, arguments, order_key)}
            )
    return None
