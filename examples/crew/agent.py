"""The calc crew written with CrewAI: a solver that has the calculator, and a reporter that states
the solver's result as the final answer, run one after the other (CrewAI's sequential process,
the solver's output the reporter's context).

Run once per rollout as a program (a ``SubprocessAgent``, see ``runner.py``): the task comes in
``FULGOR_TASK``, the model behind ``OPENAI_BASE_URL``; it prints the crew's final answer as JSON on
the last line of stdout, and the reward is the calc task's own check of it. Nothing here knows
about training but the environment variables every OpenAI client reads; each agent's LLM names
its agent in an ``X-Fulgor-Agent`` header.
"""

from __future__ import annotations

import json
import os

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

from examples.calc.calculator import calculate
from examples.crew.prompts import MAX_ITERATIONS, REPORTER, REPORTER_TASK, SOLVER, SOLVER_TASK

SAMPLING = ("temperature", "top_p", "max_tokens", "seed")
EMPTY_REPLY = "Invalid response from LLM call - None or empty"


@tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate arithmetic: + - * / ( )."""
    return calculate(expression)


def llm(agent_name: str) -> LLM:
    """The rollout's model, with its sampling parameters, naming ``agent_name`` on each call."""
    resources = json.loads(os.environ.get("FULGOR_RESOURCES", "{}"))
    sampling = resources.get("llm", {}).get("sampling_parameters", {})
    return LLM(
        model=f"openai/{os.environ['FULGOR_MODEL']}",
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        extra_headers={"X-Fulgor-Agent": agent_name},
        **{key: value for key, value in sampling.items() if key in SAMPLING},
    )


def crew(question: str) -> Crew:
    solver = Agent(
        role=SOLVER["role"],
        goal=SOLVER["goal"],
        backstory=SOLVER["backstory"],
        llm=llm(SOLVER["name"]),
        tools=[calculator],
        max_iter=MAX_ITERATIONS,
        verbose=False,
    )
    reporter = Agent(
        role=REPORTER["role"],
        goal=REPORTER["goal"],
        backstory=REPORTER["backstory"],
        llm=llm(REPORTER["name"]),
        max_iter=1,
        verbose=False,
    )
    solve = Task(description=question, expected_output=SOLVER_TASK["expected_output"], agent=solver)
    report = Task(
        description=REPORTER_TASK["description"],
        expected_output=REPORTER_TASK["expected_output"],
        agent=reporter,
        context=[solve],
    )
    return Crew(agents=[solver, reporter], tasks=[solve, report], verbose=False)


def main() -> None:
    task = json.loads(os.environ["FULGOR_TASK"])
    try:
        result = crew(task["question"]).kickoff()
    except ValueError as error:
        # CrewAI asks a model that wrote nothing three times, then gives up: the crew found no
        # answer, which scores 0. Any other error (the model unreachable, say) fails the rollout.
        if not str(error).startswith(EMPTY_REPLY):
            raise
        print(json.dumps({"answer": None, "solver": None, "error": str(error)}))
        return
    print(json.dumps({"answer": result.raw, "solver": result.tasks_output[0].raw}))


if __name__ == "__main__":
    main()
