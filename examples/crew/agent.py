"""The calc crew written with CrewAI: a solver that has the calculator, and a reporter that states
the solver's result as the final answer, run one after the other (CrewAI's sequential process,
the solver's output the reporter's context).

    fulgor train --agent examples.crew.agent:calc_crew \\
        --runner-python .frameworks/crewai/bin/python --train tasks.jsonl --model DIR

CrewAI 1.15.30 pins older ``openai`` and ``pydantic`` than fulgor's test environment, so it lives in a
virtual environment of its own (``make .frameworks/crewai/.installed``, which holds fulgor's core
too), and the trainer starts its runner processes on that environment's Python
(``Trainer(runner_python=...)``, :func:`crewai_python`). CrewAI is imported there once per runner
process, never here at import time: the trainer imports this module too, to name the agent to its
runners. Each rollout builds the crew afresh and runs it with ``Crew.kickoff_async`` (CrewAI's own
``kickoff`` in a thread), so the rollouts of a runner run side by side.

Nothing here knows about training but the ``llm`` resource (the rollout's gateway URL, model and
sampling); the reward is the calc task's own check of the crew's final answer (the reporter's).
Each agent's LLM names its agent in an ``X-Fulgor-Agent`` header: CrewAI's calls carry nothing
else that says which agent made them (its own tracing, which would, uploads to its vendor and is
off here).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from examples.calc.calculator import calculate
from examples.calc.reward import reward
from examples.crew.prompts import MAX_ITERATIONS, REPORTER, REPORTER_TASK, SOLVER, SOLVER_TASK
from fulgor import LLM, rollout
from fulgor.errors import ConfigError

__all__ = ["EMPTY_REPLY", "QUIET", "ROOT", "calc_crew", "crewai_python"]

ROOT = Path(__file__).resolve().parents[2]
SAMPLING = ("temperature", "top_p", "max_tokens", "seed")
EMPTY_REPLY = "Invalid response from LLM call - None or empty"
# CrewAI's own telemetry and trace upload would try to reach its vendor's servers from every rollout.
QUIET = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false"}


def crewai_python() -> str:
    """The Python of the CrewAI environment; ConfigError naming how to build it when missing."""
    python = os.environ.get("FULGOR_CREWAI_PYTHON") or str(ROOT / ".frameworks" / "crewai" / "bin" / "python")
    if not Path(python).is_file():
        raise ConfigError(
            f"no CrewAI environment at {python}: build it with `make .frameworks/crewai/.installed`, "
            "or set FULGOR_CREWAI_PYTHON to a Python with fulgor and "
            "tests/integration/frameworks/requirements-crewai.txt installed"
        )
    return python


def _crewai() -> Any:
    """The ``crewai`` module, with its telemetry off; an ImportError saying which Python the runners
    need where it is missing."""
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    try:
        import crewai
        from crewai import tools
    except ImportError as error:
        raise ImportError(
            f"the calc crew needs CrewAI, which {sys.executable} lacks ({error}): start the runners on "
            "the CrewAI environment's Python (Trainer(runner_python=...), fulgor train --runner-python "
            ".frameworks/crewai/bin/python; make .frameworks/crewai/.installed builds it)"
        ) from error
    return crewai, tools


def crew(question: str, llm: LLM) -> Any:
    """The crew for one question, its agents on the rollout's model."""
    crewai, tools = _crewai()

    @tools.tool("calculator")
    def calculator(expression: str) -> str:
        """Evaluate arithmetic: + - * / ( )."""
        return calculate(expression)

    sampling = {k: v for k, v in llm.sampling_parameters.items() if k in SAMPLING and v is not None}

    def model(agent: dict[str, str]) -> Any:
        return crewai.LLM(
            model=f"openai/{llm.model}",
            base_url=llm.endpoint,
            api_key=llm.api_key or "fulgor",
            extra_headers={"X-Fulgor-Agent": agent["name"]},
            **sampling,
        )

    solver = crewai.Agent(
        role=SOLVER["role"],
        goal=SOLVER["goal"],
        backstory=SOLVER["backstory"],
        llm=model(SOLVER),
        tools=[calculator],
        max_iter=MAX_ITERATIONS,
        verbose=False,
    )
    reporter = crewai.Agent(
        role=REPORTER["role"],
        goal=REPORTER["goal"],
        backstory=REPORTER["backstory"],
        llm=model(REPORTER),
        max_iter=1,
        verbose=False,
    )
    solve = crewai.Task(description=question, expected_output=SOLVER_TASK["expected_output"], agent=solver)
    report = crewai.Task(
        description=REPORTER_TASK["description"],
        expected_output=REPORTER_TASK["expected_output"],
        agent=reporter,
        context=[solve],
    )
    return crewai.Crew(agents=[solver, reporter], tasks=[solve, report], verbose=False)


@rollout
async def calc_crew(task: dict[str, Any], llm: LLM) -> float:
    """One problem through the crew; the calc check of the reporter's answer. CrewAI asks a model
    that wrote nothing three times and then gives up: the crew found no answer, which scores 0. Any
    other error (the model unreachable, say) fails the attempt, which is retried as its config says."""
    try:
        result = await crew(task["question"], llm).kickoff_async()
    except ValueError as error:
        if not str(error).startswith(EMPTY_REPLY):
            raise
        return 0.0
    return reward(result.raw, int(task["answer"]))
