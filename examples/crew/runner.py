"""The calc crew as fulgor runs it: a ``SubprocessAgent`` that starts ``agent.py`` with the CrewAI
virtual environment's Python, and scores the crew's final answer with the calc task's own check.

    fulgor train --agent examples.crew.runner:CalcCrew --dev --train tasks.jsonl --model DIR

CrewAI 1.15.30 pins older ``openai`` and ``pydantic`` than fulgor's test environment, so it lives in a
virtual environment of its own: ``make .frameworks/crewai/.installed`` builds it (``make test``
does), or set ``FULGOR_CREWAI_PYTHON`` to the Python of one that has
``tests/integration/frameworks/requirements-crewai.txt`` installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from examples.calc.reward import reward
from fulgor import SubprocessAgent
from fulgor.agent.context import AgentError
from fulgor.errors import ConfigError
from fulgor.runner.subprocess_agent import ProgramResult

__all__ = ["ROOT", "CalcCrew", "crewai_python", "score"]

ROOT = Path(__file__).resolve().parents[2]
# CrewAI's own telemetry and trace upload would try to reach its vendor's servers from every rollout.
QUIET = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false", "OTEL_SDK_DISABLED": "true"}


def crewai_python() -> str:
    """The Python of the CrewAI environment; ConfigError naming how to build it when missing."""
    python = os.environ.get("FULGOR_CREWAI_PYTHON") or str(ROOT / ".frameworks" / "crewai" / "bin" / "python")
    if not Path(python).is_file():
        raise ConfigError(
            f"no CrewAI environment at {python}: build it with `make .frameworks/crewai/.installed`, "
            "or set FULGOR_CREWAI_PYTHON to a Python with "
            "tests/integration/frameworks/requirements-crewai.txt installed"
        )
    return python


def score(result: ProgramResult) -> float:
    """The calc check of the crew's final answer (the reporter's); a program that failed fails the
    attempt with the end of what it wrote to stderr, and the rollout is retried as its config says."""
    if result.exit_code != 0:
        raise AgentError(f"the CrewAI crew exited with code {result.exit_code}: {result.stderr[-1500:]}")
    lines = result.stdout.strip().splitlines()
    answer = json.loads(lines[-1]).get("answer") if lines else None
    return reward(answer, int(result.task["answer"]))


class CalcCrew(SubprocessAgent):
    """``agent.py`` run by the CrewAI environment's Python, scored by :func:`score`."""

    def __init__(self) -> None:
        super().__init__(
            [crewai_python(), "-m", "examples.crew.agent"],
            name="calc_crew",
            reward_fn=score,
            env={"PYTHONPATH": str(ROOT), **QUIET},
            cwd=str(ROOT),
        )
