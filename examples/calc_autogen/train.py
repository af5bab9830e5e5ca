"""The calc demo's pipeline with the AutoGen agent in place of the openai-SDK one: a tiny model built
here, a warm start on the conversation the AutoGen agent has, GRPO through runner processes on the
AutoGen environment's Python, and the held-out test split.

    python -m examples.calc_autogen.train                  # a new run under runs/calc-autogen-<time>
    python -m examples.calc_autogen.train --run-dir runs/calc-autogen --seed 1

The options and the output are the calc demo's (:mod:`examples.calc.train`). The AutoGen
environment is ``.frameworks/autogen`` (``make .frameworks/autogen/.installed`` builds it, with
fulgor's core), or the Python ``FULGOR_AUTOGEN_PYTHON`` names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from examples.calc.calculator import CALCULATOR_TOOL
from examples.calc.train import DemoAgent, main
from examples.calc_autogen.agent import autogen_calc
from fulgor.errors import ConfigError

__all__ = ["AUTOGEN_TOOL", "autogen_demo_agent", "autogen_python"]

ROOT = Path(__file__).resolve().parents[2]

AUTOGEN_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        **CALCULATOR_TOOL["function"],
        "parameters": {**CALCULATOR_TOOL["function"]["parameters"], "additionalProperties": False},
        "strict": False,
    },
}
"""The calculator as AutoGen offers the MCP server's tool to the model: the calc demo's, with
``additionalProperties`` and ``strict`` added (a test holds it to what the gateway records)."""


def autogen_python() -> str:
    """The Python of the AutoGen environment; ConfigError naming how to build it when missing."""
    python = os.environ.get("FULGOR_AUTOGEN_PYTHON") or str(
        ROOT / ".frameworks" / "autogen" / "bin" / "python"
    )
    if not Path(python).is_file():
        raise ConfigError(
            f"no AutoGen environment at {python}: build it with `make .frameworks/autogen/.installed`, "
            "or set FULGOR_AUTOGEN_PYTHON to a Python with fulgor and "
            "tests/integration/frameworks/requirements-autogen.txt installed"
        )
    return python


def autogen_demo_agent() -> DemoAgent:
    """The AutoGen agent as the calc demo trains it."""
    return DemoAgent(autogen_calc, AUTOGEN_TOOL, autogen_python(), label="calc-autogen")


if __name__ == "__main__":
    raise SystemExit(main(agent=autogen_demo_agent()))
