"""The SmolLM2 demo (``make demo-smol``): the real SmolLM2-135M-Instruct imported from its GGUF
file, a LoRA warm start, GRPO on the adapter through the whole system, the held-out tests.

The quick test runs every stage with a step or two (it checks the plumbing, not the learning); the
slow one runs the demo as ``make demo-smol`` does and checks that the model learned to use the tool.
Both skip, naming ``make real-models``, where the GGUF file has not been fetched.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("gguf")

from tests.real_models import SMOLLM2_GGUF, fetched

from examples.smol.train import SmolSettings, main, run_demo
from fulgor.adapters import DriftReport
from fulgor.training.run_report import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.mark.slow(minutes=3)
def test_every_stage_runs_and_leaves_its_files(tmp_path: Path) -> None:
    settings = SmolSettings(grpo_steps=1, group_size=2, batch_tasks=2, max_tokens=24, sizes=(8, 2, 4))
    settings = replace(settings, warm=replace(settings.warm, steps=2, tool_steps=1, batch_size=2))
    run_dir = tmp_path / "smol"
    result = run_demo(run_dir, settings=settings, gguf=fetched(SMOLLM2_GGUF), progress=False)
    for path in (
        "base/config.json",
        "warm/adapter_config.json",
        "grpo/checkpoints/step-1/adapter_config.json",
    ):
        assert (run_dir / path).is_file(), path
    # The template the model was served and trained with travels with the adapters.
    saved = json.loads((run_dir / "grpo/checkpoints/step-1/tokenizer_config.json").read_text())
    template = (
        saved.get("chat_template") or (run_dir / "grpo/checkpoints/step-1/chat_template.jinja").read_text()
    )
    assert "<tools>" in template
    assert [m["step"] for m in read_metrics(run_dir / "grpo")] == [0, 1]
    [step] = [m for m in result.history if m["step"] == 1]
    assert step["rollouts"] == 4
    assert step["rollouts_failed"] == 0
    assert all(step[f"drift/{name}"] == 0 for name in DriftReport.LOSSES)
    for evaluation in (result.test_before, result.test_warm, result.test_after):
        assert evaluation["val_rollouts_failed"] == 0
    # As imported, SmolLM2 answers the calc agent in prose: no tool call, no answer.
    assert result.test_before["val_tool_call_rate"] == 0.0
    assert json.loads((run_dir / "result.json").read_text())["test_warm"] == result.test_warm


def test_a_missing_gguf_file_names_the_command_that_fetches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--run-dir", str(tmp_path / "run"), "--gguf", str(tmp_path / "none.gguf")]) == 2
    assert "make real-models" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow(minutes=20)
def test_the_demo_teaches_smollm2_the_calculator(tmp_path: Path) -> None:
    result = run_demo(tmp_path / "smol", gguf=fetched(SMOLLM2_GGUF), progress=False)
    warm, after = result.test_warm["val_accuracy"], result.test_after["val_accuracy"]
    assert result.test_before["val_accuracy"] < 0.1
    assert after >= 0.6
    assert after - warm >= 0.2
    assert result.test_after["val_tool_call_rate"] >= 0.9
    trained = [m for m in result.history if m["step"] > 0]
    assert all(m[f"drift/{name}"] == 0 for m in trained for name in DriftReport.LOSSES)
