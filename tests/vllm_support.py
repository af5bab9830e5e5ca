"""What the tests of the real vLLM share: its CPU build's virtual environment, a launch config for a
machine of few shared cores, changed weights and LoRA adapters to reload, and vLLM's processes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from fulgor.engine.vllm import VLLMConfig

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".frameworks" / "vllm" / "bin" / "python"
# vLLM's CPU build, on a machine whose few cores other test processes share: no pinning of its
# OpenMP threads to cores, one thread, a 1 GiB KV cache (its default is 4 GiB).
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def cpu_vllm(model: Path, log_dir: Path, **overrides: Any) -> VLLMConfig:
    """A config launching vLLM's CPU build from ``.frameworks/vllm`` on ``model`` (float32, as the
    trainer computes, so that logprobs compare), on a free port; fails when it is not built."""
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: make .frameworks/vllm/.installed builds it")
    options: dict[str, Any] = {
        "model": model,
        "port": 0,
        "command": (str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"),
        "env": CPU_ENV,
        "max_model_len": 1024,
        "dtype": "float32",
        "seed": 0,
        "log_path": log_dir / "vllm.log",
        "startup_timeout_seconds": 600,
        "health_interval_seconds": 2.0,
    }
    options.update(overrides)
    return VLLMConfig(**options)


def perturbed_copy(model: Path, out: Path, seed: int, scale: float = 0.05) -> Path:
    """A checkpoint of ``model`` with every weight moved by Gaussian noise (as a training step
    moves them, only more), its tokenizer beside it."""
    import torch
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in weights.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    weights.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model / name).is_file():
            shutil.copy(model / name, out / name)
    return out


def lora_adapter(model: Path, out: Path, seed: int) -> Path:
    """A PEFT LoRA adapter over ``model`` with random (not zero) weights, so that it changes outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(model), config).save_pretrained(out)
    return out
