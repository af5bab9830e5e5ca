"""``fulgor runner``: what it refuses before it starts any worker process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("option", ["--store", "--server"])
def test_an_in_memory_store_is_refused_with_what_to_use_instead(option: str) -> None:
    # Each worker process would open its own empty MemoryStore and wait forever for rollouts.
    command = [
        sys.executable, "-m", "fulgor.cli.main", "runner",
        "--agent", "tests.integration.agents.slow_agent:sleeper", option, "memory://",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Ctrl+C to stop" not in result.stdout
    assert "memory://" in result.stderr
    assert "sqlite:///" in result.stderr
    assert "fulgor serve" in result.stderr
