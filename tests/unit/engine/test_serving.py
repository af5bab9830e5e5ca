"""fulgor's engine and vLLM behind the ``Engine`` protocol: started, published to and stopped by a
session that does not know which kind it drives (vLLM's supervision against the stand-in process)."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

from fulgor.engine.base import Engine
from fulgor.engine.chat_format import SHIPPED_TEMPLATES
from fulgor.engine.errors import EngineUnavailableError
from fulgor.engine.local import EngineConfig
from fulgor.engine.serving import LocalEngineServer, VLLMEngine
from fulgor.engine.vllm import VLLMConfig
from fulgor.errors import ConfigError

STAND_IN = Path(__file__).with_name("vllm_stand_in.py")


def _stand_in(tmp_path: Path, model: Path, **overrides: object) -> VLLMConfig:
    options: dict[str, object] = {
        "model": model,
        "port": 0,
        "command": (sys.executable, str(STAND_IN), "serve"),
        "env": {"STAND_IN_LOG": str(tmp_path / "stand_in.jsonl")},
        "log_path": tmp_path / "vllm.log",
        "startup_timeout_seconds": 30,
        "enable_lora": True,
    }
    options.update(overrides)
    return VLLMConfig(**options)  # type: ignore[arg-type]


def _models(engine: Engine) -> list[str]:
    with urllib.request.urlopen(f"{engine.url}/models", timeout=10) as response:
        return [model["id"] for model in json.load(response)["data"]]


async def test_the_local_engine_serves_its_adapters_and_swaps_each_between_calls(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine: Engine = LocalEngineServer(
        EngineConfig(model=tiny_model_dir, device="cpu"), adapters={"writer": tiny_model_dir}
    )
    with pytest.raises(EngineUnavailableError, match="start"):
        _ = engine.url
    assert engine.chat_format is None  # read from the model once it loads
    try:
        await engine.start()
        assert engine.url.endswith("/v1")
        assert sorted(_models(engine)) == ["tiny", "tiny-writer"]
        assert engine.agent_models == {"writer": "tiny-writer"}
        assert (engine.model_name, engine.model_version, engine.publishes_between_calls) == ("tiny", 0, True)
        assert engine.chat_format is not None
        assert engine.chat_format.tool_parser == "hermes"
        checkpoint = tmp_path / "step-1"
        checkpoint.mkdir()
        (checkpoint / "writer").symlink_to(tiny_model_dir)
        assert await engine.publish(checkpoint) == 1  # each adapter's engine, from checkpoint/NAME
        assert engine.model_version == 1
    finally:
        await engine.stop()


async def test_vllm_reloads_through_its_supervisor_and_names_the_template_it_was_given(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = _stand_in(tmp_path, tiny_model_dir, chat_template="llama3-json-tools")
    engine: Engine = VLLMEngine(config)
    try:
        await engine.start()
        assert _models(engine) == ["tiny"]
        assert (engine.model_version, engine.publishes_between_calls, engine.agent_models) == (0, False, {})
        served = engine.chat_format
        assert served is not None
        assert (served.template, served.tool_parser) == (
            SHIPPED_TEMPLATES["llama3-json-tools"],
            "llama3_json",
        )
        adapter = tmp_path / "adapter"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        assert await engine.publish(adapter) == 1
        assert engine.model_name == "tiny-v1"  # an adapter is served under its version's name
        assert "tiny-v1" in _models(engine)
    finally:
        await engine.stop()


async def test_vllm_knows_no_chat_format_for_a_model_it_serves_by_name(tmp_path: Path) -> None:
    engine = VLLMEngine(_stand_in(tmp_path, tmp_path / "not-here", enable_lora=False))
    try:
        await engine.start()
        assert engine.chat_format is None
    finally:
        await engine.stop()


def test_one_adapter_per_agent_is_refused_on_vllm_before_it_starts(tmp_path: Path) -> None:
    config = VLLMConfig(model=tmp_path, command=("definitely-not-vllm-here", "serve"))
    with pytest.raises(ConfigError, match="one LoRA adapter per agent is served by the local engine only"):
        VLLMEngine(config, adapters={"writer": tmp_path})


# ChatML with neither tool calls nor a tool role: what SmolLM2's own template renders.
PLAIN_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("plain", [False, True])
async def test_vllm_has_the_gateway_normalise_history_only_for_a_template_that_needs_it(
    tiny_model_dir: Path, tmp_path: Path, plain: bool
) -> None:
    template = tmp_path / "plain.jinja"
    template.write_text(PLAIN_CHATML)
    config = _stand_in(tmp_path, tiny_model_dir, chat_template=str(template) if plain else None)
    engine: Engine = VLLMEngine(config)
    try:
        await engine.start()
        served = engine.chat_format
        assert served is not None
        assert served.rewrites_history is plain
        assert engine.history_format == (served if plain else None)
    finally:
        await engine.stop()
    local = LocalEngineServer(EngineConfig(model=tiny_model_dir, device="cpu"))
    assert local.history_format is None  # fulgor's engine normalises history itself
