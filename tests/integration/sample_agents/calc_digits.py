"""The calc agent's first turn with a reward an untrained model's samples differ in: the calc reward
plus the share of digits in the answer. For tests that need GRPO to move the weights (every group
has a signal), not to learn the task."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from examples.calc.agent import CALCULATOR_TOOL, http_client
from examples.calc.reward import reward
from examples.calc.single_turn import prompt_messages
from fulgor import LLM, rollout


@rollout
async def calc_digits(task: dict[str, Any], llm: LLM) -> float:
    """One call with the calc agent's prompt and tool; rewarded as the docstring above says."""
    client = AsyncOpenAI(
        base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=2, http_client=http_client()
    )
    response = await client.chat.completions.create(
        model=llm.model, messages=prompt_messages(task), tools=[CALCULATOR_TOOL], **llm.sampling_parameters
    )  # type: ignore[call-overload]
    text = response.choices[0].message.content or ""
    return reward(text, task["answer"]) + sum(c.isdigit() for c in text) / max(len(text), 1)
