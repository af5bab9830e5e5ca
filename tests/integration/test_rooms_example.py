"""The rooms example end to end: APO improves the room agent's two prompts against the simulated
model and optimiser that fulgor.testing ships, through the real store, gateway and runners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.rooms.train import main
from fulgor.types import PromptTemplate


@pytest.mark.parametrize(
    ("search", "steps"),
    # beam's three steps: ~1,000 rollouts
    [pytest.param("beam", 2, marks=pytest.mark.slow(minutes=6)), ("pareto", 5)],
)
def test_apo_finds_booking_rules_the_seed_prompts_do_not_state(
    search: str, steps: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--simulate", "--search", search, "--steps", str(steps), "--run-dir", str(tmp_path)]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "apo" / "best.json").read_text())
    candidates = {c["id"]: c for c in json.loads((tmp_path / "apo" / "candidates.json").read_text())}
    seed = candidates["seed"]
    assert seed["val_score"] < 0.2
    assert summary["score"] >= seed["val_score"] + 0.3
    # Every candidate keeps the request template's placeholders, and both prompts were edited.
    placeholders = PromptTemplate(**seed["prompts"]["prompt_template"]).placeholders
    for candidate in candidates.values():
        assert PromptTemplate(**candidate["prompts"]["prompt_template"]).placeholders == placeholders
    assert {c["edited"] for c in candidates.values() if c["edited"]} == {"prompt_template", "system_prompt"}
    printed = capsys.readouterr().out
    assert f"-> {summary['score']:.3f}" in printed
    assert str(tmp_path / "apo" / "best" / "prompt_template.txt") in printed
