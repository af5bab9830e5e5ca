"""The single-turn version of the calc task: one model call, rewarded when its calculator call is right.

The model sees the calc agent's prompt (system prompt, calculator tool, question) and answers once.
The reward is 1.0 when that answer is a call of the calculator whose expression evaluates to the
task's answer, else 0.0: the first turn of the calc agent, scored on its own. Trainers that only
score single completions (TRL's ``GRPOTrainer``) can train on it with :func:`completion_reward`,
and fulgor runs :func:`single_turn_agent`, so both learn the same thing from the same prompts.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from examples.calc.agent import CALCULATOR_TOOL, SYSTEM_PROMPT, http_client, run_tool
from fulgor import LLM, rollout

__all__ = ["call_reward", "completion_reward", "prompt_messages", "single_turn_agent"]


def prompt_messages(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation the model answers (the calc agent's first turn)."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task["question"]}]


def call_reward(name: str | None, arguments: str | None, answer: int) -> float:
    """1.0 when ``name`` is the calculator and ``arguments`` hold an expression equal to ``answer``.

    >>> call_reward("calculator", '{"expression": "12*7"}', 84), call_reward("calculator", "{}", 84)
    (1.0, 0.0)
    """
    return 1.0 if name == "calculator" and run_tool(name, arguments) == str(answer) else 0.0


def completion_reward(text: str, answer: int) -> float:
    """The reward of a completion's text, parsed as the engine parses tool calls (exactly one call)."""
    from fulgor.engine.tool_calls import parse_tool_calls

    calls = parse_tool_calls(text).tool_calls
    if len(calls) != 1:
        return 0.0
    return call_reward(calls[0].name, calls[0].arguments, answer)


@rollout
async def single_turn_agent(task: dict[str, Any], llm: LLM) -> float:
    """One model call with the calculator tool offered; the call it makes is the answer."""
    client = AsyncOpenAI(
        base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=2, http_client=http_client()
    )
    response = await client.chat.completions.create(
        model=llm.model, messages=prompt_messages(task), tools=[CALCULATOR_TOOL], **llm.sampling_parameters
    )  # type: ignore[call-overload]
    calls = response.choices[0].message.tool_calls or []
    if len(calls) != 1:
        return 0.0
    return call_reward(calls[0].function.name, calls[0].function.arguments, task["answer"])
