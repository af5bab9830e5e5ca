"""The engine a session serves with: each config made into its kind of ``Engine``, and weights
published through the protocol alone (paused or not as the engine can take them), on a simulated
engine and gateway that record what was asked of them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import pytest

from fulgor.engine.chat_format import ChatFormat
from fulgor.engine.local import EngineConfig
from fulgor.engine.serving import LocalEngineServer, VLLMEngine
from fulgor.engine.vllm import VLLMConfig
from fulgor.errors import ConfigError
from fulgor.gateway import Upstream
from fulgor.gateway.external import ExternalEngine
from fulgor.training.engines import engine_for
from fulgor.training.services import Services


def test_each_config_becomes_its_kind_of_engine(tmp_path: Path) -> None:
    local = engine_for(EngineConfig(model=tmp_path), adapters={"writer": tmp_path})
    assert isinstance(local, LocalEngineServer)
    upstream = Upstream("http://127.0.0.1:9/v1", api_key="k", request_token_ids=False)
    external = engine_for(upstream, model_name="served")
    assert isinstance(external, ExternalEngine)
    assert (external.url, external.api_key, external.request_token_ids) == (upstream.url, "k", False)
    assert (external.model_name, external.model_version, external.chat_format) == ("served", None, None)
    assert external.history_format is None


def test_vllm_gets_adapter_loading_for_lora_and_its_log_in_the_run(tmp_path: Path) -> None:
    engine = engine_for(VLLMConfig(model=tmp_path), lora=True, log_dir=tmp_path / "logs")
    assert isinstance(engine, VLLMEngine)
    assert engine.config.enable_lora
    assert engine.config.log_path == tmp_path / "logs" / "vllm.log"
    own_log = tmp_path / "mine.log"
    kept = engine_for(VLLMConfig(model=tmp_path, log_path=own_log), log_dir=tmp_path / "logs")
    assert isinstance(kept, VLLMEngine)
    assert (kept.config.log_path, kept.config.enable_lora) == (own_log, False)


async def test_an_external_server_publishes_no_weights(tmp_path: Path) -> None:
    engine = ExternalEngine(Upstream("http://127.0.0.1:9/v1"), "served")
    with pytest.raises(ConfigError, match="no weights to swap"):
        await engine.publish(tmp_path)


class SimulatedEngine:
    """An engine that records the checkpoints published to it and what the gateway was doing then."""

    def __init__(self, gateway: SimulatedGateway, *, publishes_between_calls: bool) -> None:
        self.gateway = gateway
        self.publishes_between_calls = publishes_between_calls
        self.url = "http://127.0.0.1:9/v1"
        self.api_key: str | None = None
        self.request_token_ids = True
        self.model_name = "policy"
        self.agent_models: dict[str, str] = {}
        self.model_version = 0
        self.chat_format: ChatFormat | None = None
        self.history_format: ChatFormat | None = None
        self.published: list[tuple[Path, bool]] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def publish(self, checkpoint: Path) -> int:
        self.published.append((checkpoint, self.gateway.paused))
        self.model_version += 1
        self.model_name = f"policy-v{self.model_version}"
        return self.model_version


class SimulatedGateway:
    def __init__(self) -> None:
        self.paused = False
        self.model_version: int | None = 0
        self.settled = 0

    def pause(self) -> None:
        self.paused = True

    def resume(self, model_version: int | None = None) -> None:
        self.paused = False
        self.model_version = model_version

    async def settle(self, rollout_ids: Iterable[str] | None, timeout_seconds: float) -> bool:
        self.settled += 1
        return True


def _services(*, publishes_between_calls: bool) -> tuple[Services, SimulatedEngine, SimulatedGateway]:
    gateway = SimulatedGateway()
    engine = SimulatedEngine(gateway, publishes_between_calls=publishes_between_calls)
    services = Services(cast(Any, None), engine, cast(Any, gateway), "http://127.0.0.1:9", cast(Any, None))
    return services, engine, gateway


@pytest.mark.parametrize("between_calls", [True, False])
async def test_a_paused_publish_drains_the_calls_and_resumes_with_the_new_version(
    between_calls: bool,
) -> None:
    services, engine, gateway = _services(publishes_between_calls=between_calls)
    assert await services.swap_weights("/ckpt/step-1") == 1
    assert engine.published == [(Path("/ckpt/step-1"), True)]
    assert (gateway.paused, gateway.settled, gateway.model_version) == (False, 1, 1)
    assert (services.model_name, services.model_version) == ("policy-v1", 1)


async def test_without_pause_only_an_engine_that_swaps_between_calls_keeps_taking_calls() -> None:
    services, engine, gateway = _services(publishes_between_calls=True)
    assert await services.swap_weights("/ckpt/step-1", pause=False) == 1
    assert engine.published == [(Path("/ckpt/step-1"), False)]
    assert (gateway.settled, gateway.model_version) == (0, 1)

    services, engine, gateway = _services(publishes_between_calls=False)  # vLLM: always paused
    assert await services.swap_weights("/ckpt/step-1", pause=False) == 1
    assert engine.published == [(Path("/ckpt/step-1"), True)]
    assert gateway.settled == 1
