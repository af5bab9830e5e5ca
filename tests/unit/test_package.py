"""The package surface: light import, sorted public names, one error tree, span names in one place."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fulgor
import fulgor.agent
import fulgor.weights
from fulgor import errors, semconv
from fulgor.store import _rules


def test_import_fulgor_stays_light() -> None:
    code = (
        "import sys, fulgor, fulgor.store, fulgor.types, fulgor.weights\n"
        "heavy = {'torch', 'transformers', 'vllm', 'ray', 'openai', 'fastapi', 'langchain'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("module", [fulgor, fulgor.types, fulgor.store, fulgor.agent, fulgor.weights, errors])
def test_all_is_sorted_and_importable(module: object) -> None:
    names = list(module.__all__)  # type: ignore[attr-defined]
    # isort-style, as ruff keeps it: CONSTANTS, then Classes, then functions, each alphabetical.
    assert names == sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    for name in names:
        assert hasattr(module, name), name


def test_every_error_has_one_root_and_a_code() -> None:
    codes = set()
    for name in errors.__all__:
        error_type = getattr(errors, name)
        assert issubclass(error_type, errors.FulgorError)
        codes.add(error_type.code)
    assert len(codes) == len(errors.__all__)


def test_invalid_transition_error_names_both_statuses() -> None:
    error = errors.InvalidTransitionError("rollout", "ro-1", "succeeded", "running")
    assert "'succeeded'" in error.message
    assert "'running'" in error.message
    assert error.code == "invalid_transition"


def test_span_names_are_namespaced_and_unique() -> None:
    assert all(name.startswith("fulgor.") for name in semconv.FULGOR_SPAN_NAMES)
    assert len(semconv.FULGOR_SPAN_NAMES) == 6


async def test_change_signal_wakes_a_waiter_from_another_thread() -> None:
    import asyncio
    import threading
    import time

    signal = _rules.ChangeSignal()
    seen = signal.version
    threading.Timer(0.05, signal.notify).start()
    started = time.monotonic()
    await signal.wait(seen, timeout_seconds=5)
    assert time.monotonic() - started < 2
    assert signal.version == seen + 1
    # A change that happened before the wait starts is never missed.
    await asyncio.wait_for(signal.wait(seen, timeout_seconds=5), timeout=1)
