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
        "--agent", "tests.integration.sample_agents.slow_agent:sleeper", option, "memory://",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Ctrl+C to stop" not in result.stdout
    assert "memory://" in result.stderr
    assert "sqlite:///" in result.stderr
    assert "fulgor serve" in result.stderr


def test_the_token_file_is_the_key_agents_send_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fulgor.cli.main import main
    from fulgor.runner import pool

    started: list[pool.PoolConfig] = []

    class Pool:  # records what the command would start, instead of starting worker processes
        def __init__(self, agent: str, store: str, config: pool.PoolConfig) -> None:
            started.append(config)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(pool, "RunnerPool", Pool)
    monkeypatch.delenv("FULGOR_TOKEN", raising=False)
    token_file = tmp_path / "key"
    token_file.write_text("run-key\n")
    common = [
        "runner",
        "--agent",
        "m:f",
        "--store",
        "http://127.0.0.1:1",
        "--gateway-url",
        "http://127.0.0.1:2",
    ]
    assert main([*common, "--token-file", str(token_file)]) == 0
    assert started[-1].runner.operator_key == "run-key"
    assert os.environ["FULGOR_TOKEN"] == "run-key"  # for the runners' store clients too
    monkeypatch.delenv("FULGOR_TOKEN")
    assert main(common) == 0
    assert started[-1].runner.operator_key is None  # the worker reads $FULGOR_TOKEN per rollout
    assert "--gateway-url" not in capsys.readouterr().err
    # Without a gateway nothing the agents' models do is recorded: the runner says so.
    assert main(common[: common.index("--gateway-url")]) == 0
    assert "model calls are not recorded" in capsys.readouterr().err


def test_an_empty_token_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fulgor.cli.main import main

    (tmp_path / "key").write_text("")
    command = [
        "runner",
        "--agent",
        "m:f",
        "--store",
        "http://127.0.0.1:1",
        "--token-file",
        str(tmp_path / "key"),
    ]
    assert main(command) == 2
    assert "is empty" in capsys.readouterr().err
