"""The room agent, written with the plain ``openai`` SDK: read the meeting, list the rooms, book one.

Its prompts are resources: ``prompt_template`` (the user message, with the meeting's fields as
placeholders) and, when given, ``system_prompt``. The seed prompts ask for a room and say how to
answer, but state none of the booking rules (:mod:`examples.rooms.rules`): prompt optimisation
has to find them from the grade's feedback. With ``prompt_template`` alone the agent sends no
system message, so the same agent serves one-prompt and two-prompt optimisation. Its tool and
conversation loop are :mod:`examples.rooms.tools`.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from examples.rooms.rules import grade
from examples.rooms.tools import converse, prompt_fields
from fulgor import LLM, PromptTemplate, emit_reward, rollout

__all__ = ["SEED_PROMPT", "SEED_SYSTEM_PROMPT", "first_messages", "room_agent"]

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
        final = await converse(client, llm.model, messages, str(task["id"]), **llm.sampling_parameters)
    reward, feedback = grade(final, task)
    emit_reward(reward, feedback=feedback)
