"""The engine a training session serves its model with, made from the config the Trainer was given.

``engine_for`` turns an :class:`~fulgor.engine.local.EngineConfig`, a
:class:`~fulgor.engine.vllm.VLLMConfig` or an :class:`~fulgor.gateway.Upstream` into an
:class:`~fulgor.engine.base.Engine`; ``check_engine_updates`` refuses, before anything starts, an
algorithm whose updates that kind of engine cannot serve. These two are the only places that ask
which kind of engine a run has: everything after them goes through the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.errors import ConfigError

if TYPE_CHECKING:
    from fulgor.engine.base import Engine
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.vllm import VLLMConfig
    from fulgor.gateway import Upstream

__all__ = ["check_engine_updates", "engine_for"]


def engine_for(
    config: EngineConfig | VLLMConfig | Upstream,
    *,
    model_name: str | None = None,
    adapters: Mapping[str, Path] | None = None,
    lora: bool = False,
    log_dir: Path | None = None,
) -> Engine:
    """The engine ``config`` describes, not started yet.

    ``model_name`` is the model an upstream serves the calls with (None: the one it lists).
    ``adapters`` (a name and a model directory each) are served beside the model by the local
    engine; vLLM refuses them. On vLLM, ``lora`` turns on its runtime adapter loading (each update
    publishes an adapter) and ``log_dir`` holds ``vllm.log`` unless the config names a log.
    """
    from fulgor.engine.serving import LocalEngineServer, VLLMEngine
    from fulgor.engine.vllm import VLLMConfig
    from fulgor.gateway import Upstream
    from fulgor.gateway.external import ExternalEngine

    if isinstance(config, Upstream):
        return ExternalEngine(config, model_name)
    if isinstance(config, VLLMConfig):
        if lora:
            config = replace(config, enable_lora=True)
        if config.log_path is None and log_dir is not None:
            config = replace(config, log_path=log_dir / "vllm.log")
        return VLLMEngine(config, adapters)
    return LocalEngineServer(config, adapters)


def check_engine_updates(algorithm: Any, config: EngineConfig | VLLMConfig | None) -> None:
    """On vLLM, an algorithm whose updates it can serve, or a ConfigError saying what to change."""
    from fulgor.engine.vllm import VLLMConfig

    lora = getattr(algorithm, "lora", None) is not None
    if isinstance(config, VLLMConfig) and lora and getattr(algorithm, "async_rollouts", False):
        raise ConfigError(
            "async_rollouts with a LoRA adapter on vLLM: each update's adapter is served under a name "
            "of its own and the one before is unloaded, so rollouts running across a publish would "
            "lose their model; train full weights (lora=None) or turn async_rollouts off"
        )
