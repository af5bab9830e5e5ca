"""Every documented example runs: the doctests of the modules that carry them."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "fulgor.agent.base",
    "fulgor.training.tracking",
    "examples.calc.calculator",
    "examples.calc.dataset",
    "examples.calc.reward",
    "examples.calc.single_turn",
    "examples.calc.warm_start",
    "fulgor.training.run_report",
    "fulgor.algorithms.grpo.algorithm",
    "fulgor.limits",
    "fulgor.algorithms.apo.candidates",
    "fulgor.testing.rooms",
    "examples.rooms.rules",
    "examples.rooms.dataset",
    "examples.rooms.tools",
    "fulgor.types",
    "examples.sql.agent",
    "examples.sql.database",
    "examples.sql.dataset",
    "examples.sql.execution",
    "examples.crew.prompts",
    "examples.crew.warm_start",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
