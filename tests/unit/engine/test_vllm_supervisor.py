"""vLLM supervision: the command line, and start, restart, reload and stop against a stand-in process."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.process_support import process_group

from fulgor.engine.errors import VLLMError
from fulgor.engine.vllm import VLLMConfig, VLLMServer, build_command

STAND_IN = Path(__file__).with_name("vllm_stand_in.py")


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_command_asks_for_token_ids_logprobs_and_tool_calls() -> None:
    config = VLLMConfig(
        model="/models/qwen", max_model_len=4096, seed=7, max_logprobs=5, extra_args=("--x", "1")
    )
    command = build_command(config, "/models/qwen", 8123)
    assert command[:3] == ["vllm", "serve", "/models/qwen"]
    assert "--model" not in command
    assert "--dtype" not in command
    assert _flag(command, "--port") == "8123"
    assert _flag(command, "--host") == "127.0.0.1"
    assert _flag(command, "--served-model-name") == "qwen"
    assert _flag(command, "--max-logprobs") == "5"
    assert "--return-tokens-as-token-ids" in command
    assert _flag(command, "--generation-config") == "vllm"
    assert _flag(command, "--tool-call-parser") == "hermes"
    assert "--enable-auto-tool-choice" in command
    assert _flag(command, "--max-model-len") == "4096"
    assert _flag(command, "--seed") == "7"
    assert "--enable-lora" not in command
    assert command[-2:] == ["--x", "1"]


def test_command_for_lora_and_memory() -> None:
    config = VLLMConfig(
        model="m", served_model_name="policy", enable_lora=True, max_lora_rank=16, gpu_memory_utilization=0.5
    )
    command = build_command(config, "m", 1)
    assert _flag(command, "--served-model-name") == "policy"
    assert _flag(command, "--max-lora-rank") == "16"
    assert "--enable-lora" in command
    assert _flag(command, "--gpu-memory-utilization") == "0.5"


def test_command_for_the_api_server_module_names_the_model_as_a_flag() -> None:
    module = ("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    command = build_command(VLLMConfig(model="m", command=module, dtype="float32"), "/models/m", 1)
    assert command[:5] == [*module, "--model", "/models/m"]
    assert _flag(command, "--dtype") == "float32"


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _config(tmp_path: Path, **overrides: Any) -> VLLMConfig:
    log = tmp_path / "stand_in.jsonl"
    options: dict[str, Any] = {
        "model": str(tmp_path / "base"),
        "port": 0,
        "command": (sys.executable, str(STAND_IN), "serve"),
        "env": {"STAND_IN_LOG": str(log)},
        "log_path": tmp_path / "vllm.log",
        "startup_timeout_seconds": 30,
        "health_interval_seconds": 0.2,
        "enable_lora": True,
    }
    options.update(overrides)
    return VLLMConfig(**options)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[VLLMServer]:
    supervised = VLLMServer(_config(tmp_path))
    supervised.start()
    yield supervised
    supervised.stop()


def _wait_for(condition: Any, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_start_waits_until_healthy(server: VLLMServer, tmp_path: Path) -> None:
    assert server.healthy()
    launch = _events(tmp_path / "stand_in.jsonl")[0]
    assert launch["argv"][:2] == ["serve", str(tmp_path / "base")]
    assert _flag(launch["argv"], "--port") == str(server.port)


def test_vllm_on_loopback_keeps_its_processes_there_and_reports_no_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not the test session's offline switches: the supervisor's own defaults.
    for name in ("VLLM_NO_USAGE_STATS", "VLLM_HOST_IP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DO_NOT_TRACK", "1")  # a user's, which vLLM honours: it reaches the server
    with VLLMServer(_config(tmp_path, enable_lora=False)):
        pass
    [launch] = _events(tmp_path / "stand_in.jsonl")
    assert launch["env"] == {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1"}


def test_a_users_own_choices_for_vllm_are_kept(tmp_path: Path) -> None:
    chosen = {"VLLM_NO_USAGE_STATS": "0", "VLLM_HOST_IP": "10.0.0.5"}
    config = _config(tmp_path, enable_lora=False)
    with VLLMServer(dataclasses.replace(config, env={**config.env, **chosen})):
        pass
    [launch] = _events(tmp_path / "stand_in.jsonl")
    assert (launch["env"]["VLLM_NO_USAGE_STATS"], launch["env"]["VLLM_HOST_IP"]) == ("0", "10.0.0.5")


def test_a_crashed_server_is_restarted(server: VLLMServer, tmp_path: Path) -> None:
    request = urllib.request.Request(f"{server.url}/crash", data=b"{}", method="POST")
    urllib.request.urlopen(request, timeout=5).close()
    _wait_for(lambda: server.restarts == 1 and server.healthy())
    launches = [e for e in _events(tmp_path / "stand_in.jsonl") if e["event"] == "launch"]
    assert len(launches) == 2


def test_lora_reload_loads_the_adapter_at_runtime(server: VLLMServer, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert server.reload_weights(adapter) == 1
    assert server.model_name == "base-v1"
    assert server.reload_weights(adapter) == 2
    assert server.model_name == "base-v2"
    admin = [e for e in _events(tmp_path / "stand_in.jsonl") if e["event"] != "launch"]
    assert admin == [
        {
            "event": "load_lora_adapter",
            "body": {"lora_name": "base-v1", "lora_path": str(adapter)},
            "env": "True",
        },
        {
            "event": "load_lora_adapter",
            "body": {"lora_name": "base-v2", "lora_path": str(adapter)},
            "env": "True",
        },
        {"event": "unload_lora_adapter", "body": {"lora_name": "base-v1"}, "env": "True"},
    ]


def test_full_reload_loads_the_weights_in_place(server: VLLMServer, tmp_path: Path) -> None:
    checkpoint = tmp_path / "step-1"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    assert server.reload_weights(checkpoint) == 1
    assert server.healthy()
    events = _events(tmp_path / "stand_in.jsonl")
    assert [e["event"] for e in events] == ["launch", "collective_rpc", "reset_prefix_cache"]
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint.resolve())}}
    assert events[1]["body"] == rpc
    time.sleep(0.5)  # no restart happened, and the supervisor saw none
    assert server.restarts == 0
    with pytest.raises(VLLMError, match="no checkpoint"):
        server.reload_weights(tmp_path / "missing")


def test_a_crash_after_reloads_restarts_on_the_newest_weights(server: VLLMServer, tmp_path: Path) -> None:
    checkpoint = tmp_path / "step-1"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    server.reload_weights(checkpoint)
    server.reload_weights(adapter)
    urllib.request.urlopen(urllib.request.Request(f"{server.url}/crash", data=b"{}", method="POST")).close()
    _wait_for(lambda: server.restarts == 1 and server.healthy())
    _wait_for(lambda: _events(tmp_path / "stand_in.jsonl")[-1]["event"] == "load_lora_adapter")
    events = _events(tmp_path / "stand_in.jsonl")
    relaunch = [e for e in events if e["event"] == "launch"][-1]
    assert relaunch["argv"][1] == str(checkpoint)
    assert events[-1]["body"] == {"lora_name": "base-v2", "lora_path": str(adapter)}
    assert (server.model_version, server.model_name) == (2, "base-v2")


def test_a_running_server_is_used_by_url_and_left_running(server: VLLMServer, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    config = VLLMConfig(model="base", url=f"{server.url}/", enable_lora=True, model_version=4)
    with VLLMServer(config) as attached:
        assert attached.url == server.url
        assert attached.reload_weights(adapter) == 5
        assert attached.model_name == "base-v5"
    assert server.healthy()  # not the attached supervisor's to stop
    assert [e["event"] for e in _events(tmp_path / "stand_in.jsonl")] == ["launch", "load_lora_adapter"]
    with pytest.raises(VLLMError, match="no vLLM answers"):
        VLLMServer(VLLMConfig(model="base", url="http://127.0.0.1:9")).start()


def test_a_running_server_is_made_to_serve_the_runs_weights_as_its_version(
    server: VLLMServer, tmp_path: Path
) -> None:
    """A resumed run attaches with its newest checkpoint as the model: whatever the server held, it
    serves that checkpoint (reloaded in place, or the adapter loaded) before any call."""
    checkpoint, adapter = tmp_path / "step-3", tmp_path / "adapter-3"
    for directory, config_file in ((checkpoint, "config.json"), (adapter, "adapter_config.json")):
        directory.mkdir()
        (directory / config_file).write_text("{}")
    options: dict[str, Any] = {"url": server.url, "served_model_name": "base", "model_version": 3}
    with VLLMServer(VLLMConfig(model=checkpoint, **options)) as attached:
        assert (attached.model_version, attached.model_name) == (3, "base")
    with VLLMServer(VLLMConfig(model=adapter, enable_lora=True, **options)) as attached:
        assert (attached.model_version, attached.model_name) == (3, "base-v3")
        assert "base-v3" in attached.served_models()
    events = [e for e in _events(tmp_path / "stand_in.jsonl") if e["event"] != "launch"]
    assert [e["event"] for e in events] == ["collective_rpc", "reset_prefix_cache", "load_lora_adapter"]
    assert events[0]["body"]["kwargs"] == {"weights_path": str(checkpoint.resolve())}
    assert events[2]["body"] == {"lora_name": "base-v3", "lora_path": str(adapter)}


def test_a_running_server_that_serves_another_name_is_refused(server: VLLMServer) -> None:
    with pytest.raises(VLLMError, match=r"serves base, not 'other'.*served_model_name"):
        VLLMServer(VLLMConfig(model="other", url=server.url)).start()


def test_a_server_that_cannot_start_raises_with_its_log(tmp_path: Path) -> None:
    config = _config(tmp_path)
    failing = VLLMServer(
        _config(tmp_path, env={**config.env, "STAND_IN_FAIL_START": "1"}),
    )
    with pytest.raises(VLLMError, match="exited with code 2"):
        failing.start()


def test_a_missing_vllm_says_how_to_install_it(tmp_path: Path) -> None:
    missing = VLLMServer(_config(tmp_path, command=("definitely-not-vllm-here", "serve")))
    with pytest.raises(VLLMError, match="fulgor\\[vllm\\]"):
        missing.start()


def test_supervision_gives_up_after_max_restarts(tmp_path: Path) -> None:
    supervised = VLLMServer(_config(tmp_path, max_restarts=0))
    supervised.start()
    try:
        urllib.request.urlopen(
            urllib.request.Request(f"{supervised.url}/crash", data=b"{}", method="POST")
        ).close()
        supervised.wait()
        assert supervised.failure is not None
        assert "exit code 3" in supervised.failure
    finally:
        supervised.stop()


def test_one_adapter_per_agent_loads_each_under_a_name_of_its_own(tmp_path: Path) -> None:
    command = build_command(VLLMConfig(model="m", enable_lora=True, max_loras=2), "m", 8000)
    assert _flag(command, "--max-loras") == "2"
    checkpoint = tmp_path / "step-1"
    for name in ("write", "rewrite"):
        (checkpoint / name).mkdir(parents=True)
        (checkpoint / name / "adapter_config.json").write_text("{}")
    (checkpoint / "adapters.json").write_text(json.dumps({"base": "m", "adapters": ["write", "rewrite"]}))
    with VLLMServer(_config(tmp_path, max_loras=2)) as server:
        assert server.reload_weights(checkpoint) == 1
        assert server.adapter_names == {"write": "base-write-v1", "rewrite": "base-rewrite-v1"}
    loads = [e["body"] for e in _events(tmp_path / "stand_in.jsonl") if e["event"] == "load_lora_adapter"]
    assert loads == [
        {"lora_name": "base-write-v1", "lora_path": str(checkpoint / "write")},
        {"lora_name": "base-rewrite-v1", "lora_path": str(checkpoint / "rewrite")},
    ]
    with VLLMServer(_config(tmp_path)) as one, pytest.raises(VLLMError, match="max_loras=2"):
        one.reload_weights(checkpoint)


def test_an_adapter_as_the_model_launches_its_base_and_loads_it(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    adapter = tmp_path / "step-3"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    config = _config(tmp_path, model=adapter, served_model_name="policy", model_version=3)
    with VLLMServer(config) as server:
        assert (server.model_version, server.model_name) == (3, "policy-v3")
    launch, load = _events(tmp_path / "stand_in.jsonl")
    assert launch["argv"][1] == str(base)
    assert load["body"] == {"lora_name": "policy-v3", "lora_path": str(adapter)}
    without_lora = VLLMServer(_config(tmp_path, model=adapter, enable_lora=False))
    with pytest.raises(VLLMError, match="enable_lora=True"):
        without_lora.start()
    assert without_lora.pid is not None
    assert not process_group(without_lora.pid)  # the launched vLLM was stopped
    without_lora.stop()


def test_the_template_and_parsers_are_the_ones_fulgors_engine_would_use(tmp_path: Path) -> None:
    from fulgor.engine.chat_format import SHIPPED_TEMPLATES
    from fulgor.errors import ConfigError

    (tmp_path / "chat_template.jinja").write_text(SHIPPED_TEMPLATES["llama3-json-tools"])
    command = build_command(VLLMConfig(model=tmp_path), str(tmp_path), 1)
    assert _flag(command, "--tool-call-parser") == "llama3_json"  # detected from the model's own
    assert "--chat-template" not in command
    assert "--reasoning-parser" not in command

    config = VLLMConfig(model=tmp_path, chat_template="gemma3-pythonic-tools", reasoning_parser="deepseek_r1")
    command = build_command(config, str(tmp_path), 1)
    assert _flag(command, "--chat-template") == SHIPPED_TEMPLATES["gemma3-pythonic-tools"]
    assert _flag(command, "--tool-call-parser") == "pythonic"
    assert _flag(command, "--reasoning-parser") == "deepseek_r1"

    named = build_command(VLLMConfig(model=tmp_path, tool_call_parser="mistral"), str(tmp_path), 1)
    assert _flag(named, "--tool-call-parser") == "mistral"
    with pytest.raises(ConfigError, match="no tool-call parser is called 'granite'"):
        build_command(VLLMConfig(model=tmp_path, tool_call_parser="granite"), str(tmp_path), 1)
