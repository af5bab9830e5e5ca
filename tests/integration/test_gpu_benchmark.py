"""``benchmarks/gpu.py``, the prepared GPU check, run on the CPU at its smallest settings: every part
(the engine's generation, the update on all weights and with LoRA, one Trainer step of the calc
agent) measures something, so that the check still runs when a GPU is there to run it on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.real_models import SMOLLM2_GGUF, fetched

pytest.importorskip("torch")
pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("build", "generate", "update_full", "update_lora", "grpo_step")


def run_check(*args: str) -> dict[str, str]:
    """The script's RESULT fields, after checking that it succeeded and printed every part."""
    command = [sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--smallest", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    *_, last = done.stdout.strip().splitlines()
    assert last.startswith("RESULT "), last
    return dict(item.split("=", 1) for item in last.split()[1:])


def check_parts(fields: dict[str, str], model: str, rank: int) -> None:
    assert {f"{model}_{part}_s" for part in PARTS} <= set(fields)
    for key in ("c1_tps", "c2_tps", "full_tokens_per_s", f"lora_r{rank}_tokens_per_s", "step_s", "fit_s"):
        assert float(fields[f"{model}_{key}"]) > 0, key
    assert fields[f"{model}_step_rollouts_failed"] == "0"
    assert not any(key.endswith("_peak_mb") for key in fields)  # GPU memory: only on CUDA


def test_the_gpu_check_runs_on_the_cpu_at_its_smallest_settings() -> None:
    fields = run_check()
    assert fields["device"] == "cpu"
    assert fields["dtype"] == "float32"
    check_parts(fields, "tiny", rank=4)


@pytest.mark.slow(minutes=2)
def test_the_gpu_check_imports_smollm2_from_its_gguf_file_and_measures_it() -> None:
    fetched(SMOLLM2_GGUF)
    check_parts(run_check("--models", "smollm2"), "smollm2", rank=4)
