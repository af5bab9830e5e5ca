"""A real vLLM under fulgor's supervisor: token ids, logprobs and a weight reload (needs a CUDA GPU)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.gpu


def test_vllm_returns_token_ids_and_reloads_weights(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from fulgor.engine.models import init_model
    from fulgor.engine.vllm import VLLMConfig, VLLMServer

    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    config = VLLMConfig(model=str(model), port=0, max_model_len=1024, gpu_memory_utilization=0.3)
    with VLLMServer(config) as server:
        body = {
            "model": server.model_name,
            "messages": [{"role": "user", "content": "What is 2 + 3?"}],
            "max_tokens": 8,
            "logprobs": True,
            "return_token_ids": True,
        }
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
        choice = response["choices"][0]
        assert response["prompt_token_ids"]
        assert (
            len(choice["token_ids"])
            == len(choice["logprobs"]["content"])
            == response["usage"]["completion_tokens"]
        )
        assert all(entry["token"].startswith("token_id:") for entry in choice["logprobs"]["content"])
        assert server.reload_weights(model) == 1
        again = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        assert again.status_code == 200
