"""A one-call agent written with the openai SDK, imported by module:object in the trainer tests."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from fulgor import LLM, rollout


async def _reply(task: dict[str, Any], llm: LLM) -> str:
    """The model's reply to the task's prompt, one chat call."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=3)
    try:
        reply = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            **llm.sampling_parameters,
        )
    finally:
        await client.close()
    return reply.choices[0].message.content or ""


@rollout
async def one_call(task: dict[str, Any], llm: LLM) -> float:
    """One chat call; the reward is whether the reply contains the task's letter."""
    return 1.0 if task["letter"] in await _reply(task, llm) else 0.0


@rollout
async def graded_call(task: dict[str, Any], llm: LLM) -> float:
    """One chat call; the reward is a number the reply's text fixes, different for nearly any two
    replies. It teaches nothing useful: it makes sure every group has a gradient to follow."""
    text = await _reply(task, llm)
    return sum(ord(character) * (index + 1) for index, character in enumerate(text)) % 997 / 997
