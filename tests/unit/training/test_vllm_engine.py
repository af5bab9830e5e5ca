"""What ``Trainer(engine=VLLMConfig(...))`` refuses before anything starts (the real vLLM runs in the
tests marked ``vllm``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fulgor import GRPO, Trainer, rollout
from fulgor.engine.vllm import VLLMConfig
from fulgor.errors import ConfigError
from fulgor.types import LLM
from fulgor.weights.lora import LoraConfig


@rollout
async def never_called(task: dict[str, int], llm: LLM) -> float:
    raise AssertionError("no rollout runs")


def test_one_adapter_per_agent_on_vllm_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    trainer = Trainer(
        algorithm=GRPO(adapters={"write": LoraConfig(), "check": LoraConfig()}),
        engine=VLLMConfig(model=tmp_path / "model", command=("definitely-not-vllm-here", "serve")),
        run_dir=tmp_path / "run",
        progress=False,
    )
    with pytest.raises(ConfigError, match="one LoRA adapter per agent is served by the local engine only"):
        trainer.fit(never_called, [{"task": 1}])


def test_vllm_and_an_upstream_are_not_both_given(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not both or neither"):
        Trainer(algorithm=GRPO(), engine=VLLMConfig(model=tmp_path), upstream="http://127.0.0.1:9/v1")


def test_async_rollouts_with_a_lora_adapter_on_vllm_are_refused(tmp_path: Path) -> None:
    engine = VLLMConfig(model=tmp_path / "model")
    with pytest.raises(ConfigError, match="async_rollouts with a LoRA adapter on vLLM"):
        Trainer(algorithm=GRPO(lora=LoraConfig(), async_rollouts=True), engine=engine)
    Trainer(algorithm=GRPO(lora=LoraConfig()), engine=engine)  # either alone is served
    Trainer(algorithm=GRPO(async_rollouts=True), engine=engine)
