"""Hot weight swaps over HTTP (LoRA adapter, then full weights) and tool calls from trained models.

The models here are taught, in a few seconds of training, to answer one prompt with a tool call and
another with a broken one, so tool-call parsing is checked on real generated output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
openai = pytest.importorskip("openai")

import torch  # noqa: E402
from tests.engine_support import ADD_TOOL  # noqa: E402

from fulgor.engine.app import create_app  # noqa: E402
from fulgor.engine.local import EngineConfig, LocalEngine  # noqa: E402
from fulgor.engine.models import init_model  # noqa: E402
from fulgor.engine.prompts import chat_prompt_ids  # noqa: E402
from fulgor.engine.protocol import ChatCompletionRequest  # noqa: E402
from fulgor.net.asgi import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = "policy"
TOKEN = "admin-secret"
TOOLS = [ADD_TOOL]
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
BREAK = [{"role": "user", "content": "Break the tool."}]
CALL_V1 = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 2}}\n</tool_call>'
CALL_V2 = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
BROKEN = '<tool_call>\n{"name": "add", "arguments": {"a": 2,\n</tool_call>'


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages, "tools": TOOLS})
    return chat_prompt_ids(tokenizer, request)


def _teach(model: Any, tokenizer: Any, examples: list[tuple[list[dict[str, Any]], str]]) -> None:
    """Train until greedy decoding reproduces every target (teacher forcing, loss on targets only)."""
    rows = []
    for messages, target in examples:
        prompt = _prompt_ids(tokenizer, messages)
        answer = tokenizer.encode(target + "<|im_end|>", add_special_tokens=False)
        rows.append((torch.tensor([prompt + answer]), len(prompt), torch.tensor(answer)))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    for _ in range(400):
        optimizer.zero_grad()
        learned = True
        for ids, start, answer in rows:
            logits = model(ids).logits[0, start - 1 : -1]
            torch.nn.functional.cross_entropy(logits, answer).backward()
            learned = learned and bool((logits.argmax(-1) == answer).all())
        if learned:
            break
        optimizer.step()
    model.eval()
    assert learned, "the model did not learn its targets"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("swap")
    base = init_model(root / MODEL, "tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
        ),
    )
    _teach(lora, tokenizer, [(ASK, CALL_V1)])
    lora.save_pretrained(root / "adapter-v1")
    full = AutoModelForCausalLM.from_pretrained(base)
    _teach(full, tokenizer, [(ASK, CALL_V2), (BREAK, BROKEN)])
    full.save_pretrained(root / "full-v2")
    tokenizer.save_pretrained(root / "full-v2")
    return {"base": base, "adapter": root / "adapter-v1", "full": root / "full-v2"}


@pytest.fixture(scope="module")
def engine(checkpoints: dict[str, Path]) -> LocalEngine:
    config = EngineConfig(model=checkpoints["base"], device="cpu", max_model_len=1024, admin_token=TOKEN)
    return LocalEngine.from_config(config)


@pytest.fixture(scope="module")
def url(engine: LocalEngine) -> Iterator[str]:
    with ServerThread(create_app(engine)) as server:
        yield server.url


def _swap(url: str, path: Path, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}/admin/weights", json={"path": str(path)}, headers=headers, timeout=120)


def _ask(url: str, messages: list[dict[str, Any]]) -> Any:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=40, temperature=0
    )


def test_admin_endpoint_needs_the_token(url: str, checkpoints: dict[str, Path]) -> None:
    for token in (None, "wrong"):
        response = _swap(url, checkpoints["full"], token)
        assert response.status_code == 401
        assert "Authorization: Bearer" in response.json()["error"]["message"]
    bad_path = _swap(url, checkpoints["base"] / "missing")
    assert bad_path.status_code == 400
    assert "config.json" in bad_path.json()["error"]["message"]
    assert httpx.get(f"{url}/health").json()["model_version"] == 0


async def test_admin_endpoint_is_disabled_without_a_token(engine: LocalEngine, tmp_path: Path) -> None:
    unguarded = LocalEngine(engine.model, EngineConfig(model=tmp_path))
    transport = httpx.ASGITransport(app=create_app(unguarded))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        response = await client.post("/admin/weights", json={"path": str(tmp_path)})
    assert response.status_code == 403
    assert "--admin-token-file" in response.json()["error"]["message"]


async def _long_request(url: str) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": "Count", "max_tokens": 300, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{url}/v1/completions", json=body)
    result: dict[str, Any] = response.json()
    return result


async def _swap_when_busy(url: str, engine: LocalEngine, path: Path) -> dict[str, Any]:
    for _ in range(6000):  # the generation thread offers no event to await
        if engine.stats()["running"]:
            break
        await asyncio.sleep(0.005)
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(
            f"{url}/admin/weights", json={"path": str(path)}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    result: dict[str, Any] = response.json()
    return result


async def _run_swap_during_request(url: str, engine: LocalEngine, path: Path) -> tuple[Any, Any]:
    running, swapped = await asyncio.gather(_long_request(url), _swap_when_busy(url, engine, path))
    return running, swapped


def test_swaps_load_new_versions_while_requests_finish(
    url: str, engine: LocalEngine, checkpoints: dict[str, Path]
) -> None:
    before = _ask(url, ASK)
    assert before.model_extra["model_version"] == 0
    assert not before.choices[0].message.tool_calls

    # An adapter swap requested mid-request: the request finishes on version 0.
    running, swapped = asyncio.run(_run_swap_during_request(url, engine, checkpoints["adapter"]))
    assert swapped == {"model_version": 1, "path": str(checkpoints["adapter"]), "kind": "lora"}
    assert running["usage"]["completion_tokens"] == 300
    assert running["model_version"] == 0

    with_adapter = _ask(url, ASK)
    assert with_adapter.model_extra["model_version"] == 1
    call = with_adapter.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 3, "b": 2})
    assert with_adapter.choices[0].finish_reason == "tool_calls"

    full = _swap(url, checkpoints["full"])
    assert full.status_code == 200
    assert full.json() == {"model_version": 2, "path": str(checkpoints["full"]), "kind": "full"}
    after = _ask(url, ASK)
    assert after.model_extra["model_version"] == 2
    call = after.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert after.choices[0].message.content is None
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["model_version"] == 2

    broken = _ask(url, BREAK)
    assert broken.choices[0].message.tool_calls is None
    assert broken.choices[0].message.content == BROKEN
    assert broken.choices[0].finish_reason == "stop"

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=40, temperature=0, stream=True
    )
    chunks = list(stream)
    calls = [call for chunk in chunks for call in (chunk.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(chunk.model_extra["model_version"] == 2 for chunk in chunks)


def test_an_adapter_served_beside_the_model_under_its_own_name_swaps_alone(
    checkpoints: dict[str, Path],
) -> None:
    config = EngineConfig(model=checkpoints["base"], device="cpu", max_model_len=1024, admin_token=TOKEN)
    base = LocalEngine.from_config(config)
    adapter = LocalEngine.from_config(dataclasses.replace(config, served_model_name=f"{MODEL}-add"))
    with ServerThread(create_app(base, adapters=[adapter])) as server:
        models = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert [m["id"] for m in models] == [MODEL, f"{MODEL}-add"]
        body = {"path": str(checkpoints["adapter"]), "model": f"{MODEL}-add"}
        swapped = httpx.post(
            f"{server.url}/admin/weights",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        assert swapped.json()["model_version"] == 1
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

        def ask(model: str) -> Any:
            return client.chat.completions.create(
                model=model, messages=ASK, tools=TOOLS, max_tokens=40, temperature=0
            )

        with_adapter = ask(f"{MODEL}-add")
        assert with_adapter.model_extra["model_version"] == 1
        call = with_adapter.choices[0].message.tool_calls[0]
        assert json.loads(call.function.arguments) == {"a": 3, "b": 2}
        plain = ask(MODEL)  # the model itself is untouched
        assert plain.model_extra["model_version"] == 0
        assert not plain.choices[0].message.tool_calls
        with pytest.raises(openai.BadRequestError, match=f"serves '{MODEL}, {MODEL}-add'"):
            ask("another")
