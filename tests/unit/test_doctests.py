"""Every documented example runs: the doctests of every module of fulgor and its examples that
carries them, found by reading the sources (so a module that gains examples is never left out)."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_EXAMPLE = re.compile(r"^\s*>>> (?!.*doctest: \+SKIP)", re.MULTILINE)


def modules_with_doctests() -> list[str]:
    """The importable names of the modules under ``src/fulgor`` and ``examples`` holding an example
    that is not skipped."""
    found = []
    for top, package in ((ROOT / "src", "fulgor"), (ROOT, "examples")):
        for path in sorted((top / package).rglob("*.py")):
            if _EXAMPLE.search(path.read_text(encoding="utf-8")):
                name = ".".join(path.relative_to(top).with_suffix("").parts)
                found.append(name.removesuffix(".__init__"))
    return found


MODULES = modules_with_doctests()


def test_the_modules_are_found() -> None:
    assert {"fulgor.types", "examples.calc.reward", "examples.rag.reward"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0
