"""The AutoGen calc agent as fulgor runs it: a ``SubprocessAgent`` that starts ``agent.py`` with the
AutoGen virtual environment's Python, and scores its last line with the calc task's own check.

    fulgor train --agent examples.calc_autogen.runner:AutogenCalc --dev --train tasks.jsonl --model DIR

AutoGen 0.7.5 pins protobuf 5.29, older than fulgor's TensorBoard tracker needs, so it lives in a
virtual environment of its own: ``make .frameworks/autogen/.installed`` builds it (``make test``
does), or set ``FULGOR_AUTOGEN_PYTHON`` to the Python of one that has
``tests/integration/frameworks/requirements-autogen.txt`` installed.
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

__all__ = ["ROOT", "AutogenCalc", "autogen_python", "score"]

ROOT = Path(__file__).resolve().parents[2]


def autogen_python() -> str:
    """The Python of the AutoGen environment; ConfigError naming how to build it when missing."""
    python = os.environ.get("FULGOR_AUTOGEN_PYTHON") or str(
        ROOT / ".frameworks" / "autogen" / "bin" / "python"
    )
    if not Path(python).is_file():
        raise ConfigError(
            f"no AutoGen environment at {python}: build it with `make .frameworks/autogen/.installed`, "
            "or set FULGOR_AUTOGEN_PYTHON to a Python with "
            "tests/integration/frameworks/requirements-autogen.txt installed"
        )
    return python


def score(result: ProgramResult) -> float:
    """The calc check of the agent's final reply; a program that failed (its MCP server crashed, say)
    fails the attempt with the end of what it wrote to stderr, and the rollout is retried as its
    config says."""
    if result.exit_code != 0:
        raise AgentError(f"the AutoGen agent exited with code {result.exit_code}: {result.stderr[-1500:]}")
    lines = result.stdout.strip().splitlines()
    answer = json.loads(lines[-1]).get("answer") if lines else None
    return reward(answer, int(result.task["answer"]))


class AutogenCalc(SubprocessAgent):
    """``agent.py`` run by the AutoGen environment's Python, scored by :func:`score`."""

    def __init__(self) -> None:
        super().__init__(
            [autogen_python(), "-m", "examples.calc_autogen.agent"],
            name="autogen_calc",
            reward_fn=score,
            env={"PYTHONPATH": str(ROOT)},
            cwd=str(ROOT),
        )
