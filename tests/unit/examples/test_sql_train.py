"""The SQL demo's command line: which agents train, and the options it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from examples.sql import train


def arguments_of_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str) -> dict[str, Any]:
    """What ``main(argv)`` asks ``run_demo`` for (the run itself is interrupted at once: status 130)."""
    seen: dict[str, Any] = {}

    def interrupted(run_dir: Path, **options: Any) -> None:
        seen.update(options)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run_demo", interrupted)
    assert train.main(["--run-dir", str(tmp_path / "sql"), *argv]) == 130
    return seen


def test_the_default_trains_the_writer_and_the_rewriter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = arguments_of_run(monkeypatch, tmp_path)
    assert options["agent_match"] == "write|rewrite"
    assert options["adapters"] == ()
    assert arguments_of_run(monkeypatch, tmp_path, "--agent-match", "all")["agent_match"] is None


def test_adapters_train_one_lora_adapter_each_for_the_writer_and_the_rewriter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = arguments_of_run(monkeypatch, tmp_path, "--adapters")
    assert options["adapters"] == ("write", "rewrite")
    assert options["agent_match"] is None  # the adapters pick the calls


def test_adapters_with_an_agent_match_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        train.main(["--adapters", "--agent-match", "all"])
    assert stopped.value.code == 2
    assert "drop --agent-match" in capsys.readouterr().err


def test_demo_grpo_gives_each_adapter_its_own_lora_and_the_larger_learning_rate() -> None:
    pytest.importorskip("torch")
    from fulgor.weights.lora import LoraConfig

    grpo = train.demo_grpo(adapters=train.ADAPTERS, agent_match=None)
    assert grpo.adapters == {"write": LoraConfig(rank=8), "rewrite": LoraConfig(rank=8)}
    assert grpo.config.learning_rate == train.ADAPTER_LEARNING_RATE
    assert train.demo_grpo().config.learning_rate == train.LEARNING_RATE
