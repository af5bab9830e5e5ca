"""``Trainer(engine=VLLMConfig(...))``: GRPO trains the calc agent's model while the real vLLM (its CPU
build) serves it; each update is published without a restart, and every recorded call was served
by, and names, the weights of the publish it followed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.engine_support import assert_logprobs_of
from tests.integration.sample_agents.calc_digits import calc_digits
from tests.vllm_support import cpu_vllm

from examples.calc.dataset import make_splits
from fulgor import GRPO, Trainer, semconv
from fulgor.engine.models import init_model
from fulgor.store.sqlite import SqliteStore
from fulgor.types import ModelCall

pytestmark = pytest.mark.vllm

STEPS = 3


async def calls_by_step(path: Path) -> dict[int, list[ModelCall]]:
    """Every recorded model call, by the training step its rollout ran in."""
    store = SqliteStore(path)
    try:
        found: dict[int, list[ModelCall]] = {}
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL)
            calls = [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]
            found.setdefault(int(rollout.metadata["step"]), []).extend(calls)
        return found
    finally:
        await store.close()


def vllm_processes(model: Path) -> set[int]:
    """Live processes of vLLM: its server naming ``model``, and every engine core and worker (their
    command lines are ``VLLM::...``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (command.startswith("VLLM::") or ("vllm" in command and str(model) in command)):
            found.add(int(entry.name))
    return found


def _hf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_grpo_publishes_each_update_to_vllm(tmp_path: Path, one_torch_thread: None) -> None:
    model = init_model(tmp_path / "small", "small", seed=0)
    trainer = Trainer(
        algorithm=GRPO(group_size=4, batch_tasks=2, max_steps=STEPS, max_tokens=8, temperature=1.0, seed=0),
        engine=cpu_vllm(model, tmp_path, device="cpu", log_path=None),  # the run's logs/vllm.log
        run_dir=tmp_path / "run",
        n_runners=1,
        keep_checkpoints=0,
        torch_threads=1,
        progress=False,
    )
    before = vllm_processes(model)
    history = trainer.fit(calc_digits, make_splits(seed=0, sizes=(8, 4, 4))["train"])
    assert [m["step"] for m in history] == list(range(1, STEPS + 1))
    assert [m["model_version"] for m in history] == list(range(1, STEPS + 1))
    assert all(m["rollouts_failed"] == 0 and "update_skipped" not in m for m in history)
    assert not vllm_processes(model) - before  # the trainer stopped vLLM and all it started
    assert "/collective_rpc" in (tmp_path / "run" / "logs" / "vllm.log").read_text()  # its reloads
    # Version v served step v+1: the base first, then checkpoints/step-v.
    weights = [model] + [tmp_path / "run" / "checkpoints" / f"step-{v}" for v in range(1, STEPS)]
    calls = asyncio.run(calls_by_step(tmp_path / "run" / "store.sqlite"))
    assert sorted(calls) == list(range(1, STEPS + 1))
    for step, step_calls in calls.items():
        assert len(step_calls) == 8
        assert {call.model_version for call in step_calls} == {step - 1}
        served = _hf(weights[step - 1])
        for call in step_calls:
            assert_logprobs_of(served, call)  # vLLM served exactly the published weights
        if step > 1:  # and they changed with the publish
            with pytest.raises(AssertionError):
                assert_logprobs_of(_hf(weights[step - 2]), step_calls[0])
