"""The real vLLM (its CPU build, from ``.frameworks/vllm``) under fulgor's supervisor, on a small model
built here: the flags it is launched with, token ids and logprobs through the gateway (streamed and
not), full weights reloaded in place, LoRA adapters served by name, and a restart after it hangs.

One server serves the whole module (vLLM takes 30-80 s to start on 2 cores); the tests run in file
order and each says which weights it leaves served.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.engine_support import assert_logprobs_of
from tests.integration.gateway_support import gateway_env
from tests.process_support import process_group
from tests.vllm_support import cpu_vllm, lora_adapter, perturbed_copy

from fulgor.engine.errors import VLLMError
from fulgor.engine.models import init_model
from fulgor.engine.vllm import VLLMConfig, VLLMServer
from fulgor.types import ModelCall

pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "What is 12 + 30? Use the calculator."}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # `small`: vLLM's CPU attention refuses the head size 16 of `tiny` (head_dim=16 is unsupported).
    return init_model(tmp_path_factory.mktemp("model") / "small", "small", seed=0)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    config = cpu_vllm(model, tmp_path_factory.mktemp("vllm"), enable_lora=True, max_lora_rank=8)
    supervised = VLLMServer(config)
    supervised.start()
    pgid = supervised.pid
    yield supervised
    supervised.stop()
    assert pgid is not None
    assert not process_group(pgid), "vLLM processes outlived stop()"


def _chat(server: VLLMServer, **extra: Any) -> dict[str, Any]:
    """Greedy, straight to vLLM, with its token ids and logprobs."""
    body = {"model": server.model_name, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    body |= {"logprobs": True, "return_token_ids": True, **extra}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _logprobs(answer: dict[str, Any]) -> list[float]:
    return [entry["logprob"] for entry in answer["choices"][0]["logprobs"]["content"]]


def _as_call(answer: dict[str, Any]) -> ModelCall:
    choice = answer["choices"][0]
    return ModelCall(
        request={},
        prompt_token_ids=answer["prompt_token_ids"],
        response_token_ids=choice["token_ids"],
        response_logprobs=_logprobs(answer),
    )


def _served(server: VLLMServer) -> list[str]:
    """The model names vLLM serves now; none while it does not answer."""
    try:
        listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    except httpx.HTTPError:
        return []
    return [entry["id"] for entry in listed]


def _hf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_vllm_runs_with_the_supervisors_flags(server: VLLMServer, model: Path) -> None:
    assert server.healthy()
    listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    assert [(entry["id"], entry["max_model_len"]) for entry in listed] == [("small", 1024)]
    answer = _chat(server, top_logprobs=2)
    choice = answer["choices"][0]
    # --return-tokens-as-token-ids: each logprob names its token by id, which the ids list repeats.
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert tokens == [f"token_id:{token}" for token in choice["token_ids"]]
    assert len(choice["token_ids"]) == answer["usage"]["completion_tokens"]
    # --max-logprobs 20: more is refused.
    refused = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "small", "messages": QUESTION, "max_tokens": 2, "logprobs": True, "top_logprobs": 21},
        timeout=120,
    )
    assert refused.status_code == 400
    # --dtype float32: the logprobs are the model's own, as transformers computes them.
    assert_logprobs_of(_hf(model), _as_call(answer))


async def test_the_gateway_records_vllms_ids_and_logprobs(server: VLLMServer, model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    direct = _chat(server)
    async with gateway_env([f"{server.url}/v1"]) as env:
        rollout, base = await env.rollout()
        body = {"model": server.model_name, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
        async with httpx.AsyncClient(timeout=300) as client:
            plain = (await client.post(f"{base}/chat/completions", json=body)).json()
            streamed = ""
            async with client.stream("POST", f"{base}/chat/completions", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for choice in json.loads(line[6:])["choices"]:
                            streamed += choice["delta"].get("content") or ""
        calls = await env.calls(rollout, 2)
    seen = [plain["choices"][0]["message"]["content"], streamed]
    assert seen[0] == seen[1]  # greedy: the same answer both ways
    for call, text in zip(sorted(calls, key=lambda c: bool(c.request.get("stream"))), seen, strict=True):
        assert not call.token_ids_missing
        assert call.prompt_token_ids == direct["prompt_token_ids"]
        assert call.response_token_ids == direct["choices"][0]["token_ids"]
        assert call.response_logprobs == pytest.approx(_logprobs(direct), abs=1e-4)
        assert tokenizer.decode(call.response_token_ids, skip_special_tokens=True) == text


def test_full_weights_reload_in_place(server: VLLMServer, model: Path, tmp_path: Path) -> None:
    """Leaves the perturbed weights served, as version 2 (then 3 after the reload back)."""
    pid, version = server.pid, server.model_version
    before = _chat(server)
    changed = perturbed_copy(model, tmp_path / "step-1", seed=1)
    assert server.reload_weights(changed) == version + 1
    after = _chat(server)
    assert _logprobs(after) != pytest.approx(_logprobs(before), abs=1e-3)
    assert_logprobs_of(_hf(changed), _as_call(after))  # exactly the new weights, prefix cache too
    assert server.reload_weights(model) == version + 2
    assert _logprobs(_chat(server)) == pytest.approx(_logprobs(before), abs=1e-4)
    assert server.reload_weights(changed) == version + 3
    assert (server.pid, server.restarts) == (pid, 0)  # no restart
    with pytest.raises(VLLMError, match="no checkpoint"):
        server.reload_weights(tmp_path / "missing")


def test_a_running_vllm_attached_by_url_serves_the_runs_weights(
    server: VLLMServer, model: Path, tmp_path: Path
) -> None:
    """Attached by ``url`` with the base as a resumed run's weights, version 7: the base serves, not
    the perturbed weights the test before left. Leaves those perturbed weights served again."""
    config = VLLMConfig(model=model, url=server.url, served_model_name="small", model_version=7)
    with VLLMServer(config) as attached:
        assert attached.model_version == 7
        assert_logprobs_of(_hf(model), _as_call(_chat(server)))
        changed = perturbed_copy(model, tmp_path / "step-1", seed=1)  # the test before's weights
        assert attached.reload_weights(changed) == 8
        assert_logprobs_of(_hf(changed), _as_call(_chat(server)))
    assert server.healthy()  # left running: not the attached supervisor's to stop


def test_lora_adapters_load_and_serve_by_name(server: VLLMServer, model: Path, tmp_path: Path) -> None:
    """Leaves the second adapter served, over the perturbed weights of the test before."""
    base = _logprobs(_chat(server))
    version = server.model_version
    first = lora_adapter(model, tmp_path / "lora-1", seed=1)
    assert server.reload_weights(first) == version + 1
    assert server.model_name == f"small-v{version + 1}"
    adapted = _chat(server)
    assert adapted["model"] == server.model_name
    assert _logprobs(adapted) != pytest.approx(base, abs=1e-3)
    second = lora_adapter(model, tmp_path / "lora-2", seed=2)
    assert server.reload_weights(second) == version + 2
    assert _served(server) == ["small", f"small-v{version + 2}"]  # the adapter replaced is unloaded
    assert _logprobs(_chat(server)) != pytest.approx(_logprobs(adapted), abs=1e-3)


def test_a_hung_vllm_is_restarted_on_its_newest_weights(server: VLLMServer) -> None:
    """After the tests before: the perturbed full weights, and the second adapter over them."""
    served = _logprobs(_chat(server))
    pid = server.pid
    assert pid is not None
    # vLLM and everything it started stop answering: health checks fail, and SIGTERM waits unhandled.
    os.killpg(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 600
    while not (server.restarts == 1 and server.model_name in _served(server)):
        assert time.monotonic() < deadline, "vLLM was not restarted with its adapter"
        time.sleep(1)
    assert server.pid != pid
    assert not process_group(pid)  # the hung processes were killed, not left behind
    assert _logprobs(_chat(server)) == pytest.approx(served, abs=1e-4)
