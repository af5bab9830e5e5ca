"""A one-call agent written with the openai SDK, imported by module:object in the trainer tests."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from fulgor import LLM, rollout


@rollout
async def one_call(task: dict[str, Any], llm: LLM) -> float:
    """One chat call; the reward is whether the reply contains the task's letter."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=3)
    try:
        reply = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            **llm.sampling_parameters,
        )
    finally:
        await client.close()
    return 1.0 if task["letter"] in (reply.choices[0].message.content or "") else 0.0


@rollout
async def graded_call(task: dict[str, Any], llm: LLM) -> float:
    """One chat call; the reward is a number the reply's text fixes, different for nearly any two
    replies. It teaches nothing useful: it makes sure every group has a gradient to follow."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=3)
    try:
        reply = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            **llm.sampling_parameters,
        )
    finally:
        await client.close()
    text = reply.choices[0].message.content or ""
    return sum(ord(character) * (index + 1) for index, character in enumerate(text)) % 997 / 997
