"""What the crew's two agents are told, and the calculator as CrewAI offers it to the model: the
standard library only, so that the crew program (in CrewAI's own environment) and its warm start (in
fulgor's) share them exactly.

CrewAI builds each agent's messages from these: the system message ``You are {role}.
{backstory}\\nYour personal goal is: {goal}``, and a user message with the task's description, its
expected output and, for the reporter, the solver's answer as context. They are kept short so that
a whole conversation fits a tiny model's context with room to spare.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CALCULATOR_TOOL",
    "CONTEXT_HEADER",
    "MAX_ITERATIONS",
    "REPORTER",
    "REPORTER_TASK",
    "SOLVER",
    "SOLVER_TASK",
    "conversation_start",
]

# name: the agent's name on its model calls (its X-Fulgor-Agent header); the rest is CrewAI's Agent.
SOLVER = {
    "name": "solver",
    "role": "Solver",
    "goal": "Compute the number.",
    "backstory": "You use the calculator.",
}
REPORTER = {
    "name": "reporter",
    "role": "Reporter",
    "goal": "State the answer.",
    "backstory": "You reply with Answer: and the number.",
}
# The solver's task describes itself with the question; the reporter's is fixed.
SOLVER_TASK = {"expected_output": "The number."}
REPORTER_TASK = {"description": "Reply with Answer: and the number.", "expected_output": "Answer: N"}
# How many model calls the solver may take before CrewAI asks it for its final answer.
MAX_ITERATIONS = 3

# The calc task's calculator as CrewAI 1.x sends it (native tool calling, strict schema).
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic: + - * / ( ).",
        "strict": True,
        "parameters": {
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
            "type": "object",
            "additionalProperties": False,
        },
    },
}

CONTEXT_HEADER = "\n\nThis is the context you're working with:\n"


def conversation_start(
    agent: dict[str, str], description: str, expected_output: str, context: str | None = None
) -> list[dict[str, Any]]:
    """The first two messages CrewAI 1.15 sends for ``agent`` on a task (a test holds this to what
    the gateway records).

    >>> [m["role"] for m in conversation_start(SOLVER, "What is 2 plus 3?", "The number.")]
    ['system', 'user']
    """
    system = f"You are {agent['role']}. {agent['backstory']}\nYour personal goal is: {agent['goal']}"
    user = (
        f"\nCurrent Task: {description}\n\nThis is the expected criteria for your final answer: "
        f"{expected_output}\nyou MUST return the actual complete content as the final answer, not a summary."
    )
    if context is not None:
        user += f"{CONTEXT_HEADER}{context}\n\nProvide your complete response:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
