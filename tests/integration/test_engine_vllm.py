"""A real vLLM under fulgor's supervisor on a CUDA GPU: token ids, logprobs and a weight reload in
place. Not run by CI (no GPU there); the same checks run on vLLM's CPU build in the tests marked
``vllm`` (``test_vllm_server.py``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.gpu


def test_vllm_returns_token_ids_and_reloads_weights(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from tests.vllm_support import perturbed_copy

    from fulgor.engine.models import init_model
    from fulgor.engine.vllm import VLLMConfig, VLLMServer

    # `small` (head size 32), as on the CPU build: vLLM's attention backends do not all take `tiny`'s 16.
    model = init_model(tmp_path / "small", "small", seed=0)
    config = VLLMConfig(model=str(model), port=0, max_model_len=1024, gpu_memory_utilization=0.3)
    with VLLMServer(config) as server:
        body = {
            "model": server.model_name,
            "messages": [{"role": "user", "content": "What is 2 + 3?"}],
            "max_tokens": 8,
            "temperature": 0,
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
        pid = server.pid
        assert server.reload_weights(perturbed_copy(model, tmp_path / "step-1", seed=1)) == 1
        again = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
        before = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        after = [entry["logprob"] for entry in again["choices"][0]["logprobs"]["content"]]
        assert after != pytest.approx(before, abs=1e-3)  # the new weights serve
        assert (server.pid, server.restarts) == (pid, 0)  # without a restart
