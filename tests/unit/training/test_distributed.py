"""The update across processes: two ranks under torchrun (gloo, CPU) against one process.

Every run here is a real ``torch.distributed.run`` of ``sharded_steps.py`` with two ranks, FSDP2
over a tiny model built locally; the references are the one-process ``PolicyUpdater`` on the same
trajectories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from sharded_rows import batch

from fulgor.algorithms.grpo import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater, RowShare
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError
from fulgor.training.distributed import (
    OPTIMIZER_DIR,
    check_shardable,
    local_torchrun,
    resume_unsharded,
    world_from_env,
)
from fulgor.weights.loading import load_model
from fulgor.weights.policy import Policy, load_policy, load_training_state

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HERE = Path(__file__).resolve().parent
# Micro-batches of two: the five rows split three and two, so one rank runs an idle micro-batch.
CONFIG = {"learning_rate": 1e-2, "weight_decay": 0.01, "micro_batch_size": 2}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("sharded") / "tiny", "tiny", seed=0)


def run_ranks(base: Path, jobs: list[dict[str, Any]], out: Path, device: str = "cpu") -> None:
    """``sharded_steps.py`` under torchrun with two ranks on ``device``, running ``jobs`` in turn."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "jobs.json").write_text(json.dumps({"base": str(base), "jobs": jobs, "device": device}))
    folder = out / "ranks"  # where they meet: on loopback only, as fulgor train --nproc's ranks do
    folder.mkdir()
    options, environment = local_torchrun(2, folder)
    env = {**os.environ, **environment, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    command = [
        sys.executable, "-m", "torch.distributed.run", *options,
        str(HERE / "sharded_steps.py"), str(out / "jobs.json"),
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]


def job(
    start: Path, start_step: int, offsets: list[int], out: Path, flat: bool = False, **config: Any
) -> dict[str, Any]:
    out.mkdir(parents=True)
    return {
        "start": str(start), "start_step": start_step, "offsets": offsets, "checkpoints": str(out),
        "flat": flat, "config": {**CONFIG, **config},
    }  # fmt: skip


def rank_metrics(out: Path) -> list[dict[str, float]]:
    metrics: list[dict[str, float]] = json.loads((out / "metrics.json").read_text())
    return metrics


def one_process(start: Path, offsets: list[int], **config: Any) -> tuple[Any, PolicyUpdater, list[Any]]:
    """The one-process update from ``start`` over the batches of ``offsets``."""
    policy = load_policy(start, "cpu")
    updater = PolicyUpdater(policy.model, GRPOConfig(**{**CONFIG, **config}))
    metrics = [updater.step(batch(offset)) for offset in offsets]
    return policy.model, updater, metrics


def weights(path_or_model: Path | Any) -> dict[str, torch.Tensor]:
    model = (
        load_model(path_or_model, device="cpu", dtype="float32").model
        if isinstance(path_or_model, Path)
        else path_or_model
    )
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def assert_same_step(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """The weights of two runs of a step at ``CONFIG``'s learning rate agree within float rounding as
    AdamW passes it on: its first step moves each weight by about the learning rate times
    ``g / (|g| + 1e-8)``, so a gradient near 1e-9 turns a rounding difference into up to 1e-4 (1% of
    the step); all but one weight in a thousand agree within 1e-6."""
    assert max_difference(a, b) < 2e-4
    differing = sum(int(((a[name] - b[name]).abs() > 1e-6).sum()) for name in a)
    assert differing < 1e-3 * sum(t.numel() for t in a.values())


def optimizer_state(checkpoint: Path) -> dict[str, Any]:
    """A sharded checkpoint's optimiser state, read whole by one process, by parameter name."""
    policy = load_policy(checkpoint, "cpu")
    updater = PolicyUpdater(policy.model, GRPOConfig(**CONFIG))
    resume_unsharded(updater, policy.model, checkpoint, load_training_state(checkpoint)["updater"])
    names = [name for name, _ in policy.model.named_parameters()]
    state = updater.optimizer.state_dict()["state"]
    return {names[index]: value for index, value in state.items()}


@pytest.fixture(scope="module")
def runs(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One torchrun of two ranks, six runs on them: ``two_steps`` (two steps from the base weights),
    ``resumed`` (its step 2 again, from its ``step-1``), ``from_plain`` (step 2 from a one-process
    checkpoint of step 1), ``checkpointed`` (step 1 with gradient checkpointing), ``flat`` (a step
    that teaches nothing, so the optimiser never steps) and ``after_flat`` (a step from its
    checkpoint)."""
    root = tmp_path_factory.mktemp("ranks")
    model, updater, _ = one_process(model_dir, [0])
    plain = Policy(model, load_policy(model_dir, "cpu").tokenizer).save(
        root / "plain", 1, {"updater": updater.state_dict()}
    )
    names = ("two_steps", "resumed", "from_plain", "checkpointed", "flat", "after_flat")
    out = {name: root / name for name in names}
    jobs = [
        job(model_dir, 0, [0, 1], out["two_steps"]),
        job(out["two_steps"] / "step-1", 1, [1], out["resumed"]),
        job(plain, 1, [1], out["from_plain"]),
        job(model_dir, 0, [0], out["checkpointed"], gradient_checkpointing=True),
        job(model_dir, 0, [0], out["flat"], flat=True),
        job(out["flat"] / "step-1", 1, [1], out["after_flat"]),
    ]
    run_ranks(model_dir, jobs, root)
    return out


def test_two_ranks_step_gives_one_process_weights(model_dir: Path, runs: dict[str, Path]) -> None:
    out, metrics = runs["two_steps"], rank_metrics(runs["two_steps"])
    model, _, reference = one_process(model_dir, [0])
    assert_same_step(weights(out / "step-1"), weights(model))
    assert max_difference(weights(out / "step-1"), weights(model_dir)) > 1e-3  # the step moved them
    for key in ("policy_loss", "grad_norm", "entropy", "trained_tokens"):
        assert metrics[0][key] == pytest.approx(reference[0][key], rel=1e-4, abs=1e-6), key
    assert metrics[0]["optimizer_steps"] == 1.0


def test_checkpoint_holds_full_weights_and_optimizer_shards(runs: dict[str, Path]) -> None:
    out = runs["two_steps"]
    checkpoint = out / "step-2"
    assert (checkpoint / "config.json").is_file()
    assert json.loads((checkpoint / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (checkpoint / "tokenizer.json").is_file()
    shards = sorted(path.name for path in (checkpoint / OPTIMIZER_DIR).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    state = load_training_state(checkpoint)
    assert state is not None
    assert state["step"] == 2
    assert state["updater"]["optimizer_shards"] == OPTIMIZER_DIR


def test_resume_on_two_ranks_gives_the_same_next_step(runs: dict[str, Path]) -> None:
    out, resumed = runs["two_steps"], runs["resumed"]
    again = weights(resumed / "step-2")
    assert all(torch.equal(tensor, again[name]) for name, tensor in weights(out / "step-2").items())
    uninterrupted, again_state = optimizer_state(out / "step-2"), optimizer_state(resumed / "step-2")
    assert uninterrupted.keys() == again_state.keys()
    for name in uninterrupted:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(uninterrupted[name][key], again_state[name][key]), (name, key)
    assert rank_metrics(resumed)[0] == rank_metrics(out)[1]


def test_one_process_resumes_a_sharded_checkpoint(runs: dict[str, Path]) -> None:
    """A checkpoint of two ranks continued by one process: the optimiser state is read whole, and the
    next step is the two ranks' within float rounding."""
    out = runs["two_steps"]
    policy = load_policy(out / "step-1", "cpu")
    updater = PolicyUpdater(policy.model, GRPOConfig(**CONFIG))
    resume_unsharded(updater, policy.model, out / "step-1", load_training_state(out / "step-1")["updater"])
    updater.step(batch(1))
    assert_same_step(weights(policy.model), weights(out / "step-2"))


def test_a_checkpoint_whose_optimiser_never_stepped_resumes(model_dir: Path, runs: dict[str, Path]) -> None:
    """A step that teaches nothing skips the optimiser's step, so its checkpoint holds no optimiser
    state: two ranks and one process continue from it as from a fresh optimiser."""
    assert rank_metrics(runs["flat"])[0]["optimizer_steps"] == 0
    assert max_difference(weights(runs["flat"] / "step-1"), weights(model_dir)) == 0
    assert optimizer_state(runs["flat"] / "step-1") == {}
    model, _, _ = one_process(model_dir, [1])  # a fresh optimiser's first step
    assert_same_step(weights(runs["after_flat"] / "step-2"), weights(model))


def test_two_ranks_resume_a_one_process_checkpoint(model_dir: Path, runs: dict[str, Path]) -> None:
    model, _, _ = one_process(model_dir, [0, 1])
    assert_same_step(weights(runs["from_plain"] / "step-2"), weights(model))


def test_gradient_checkpointing_on_two_ranks_gives_the_same_step(
    model_dir: Path, runs: dict[str, Path]
) -> None:
    model, _, _ = one_process(model_dir, [0])
    assert_same_step(weights(runs["checkpointed"] / "step-1"), weights(model))


def gradients(start: Path, **config: Any) -> torch.Tensor:
    """The one-process update's gradient on ``batch(0)``, as the optimiser would get it."""
    policy = load_policy(start, "cpu")
    updater = PolicyUpdater(policy.model, GRPOConfig(**{**CONFIG, **config}))
    seen: list[torch.Tensor] = []

    def capture() -> None:
        seen.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))

    updater.optimizer.step = capture  # type: ignore[method-assign,assignment]
    updater.step(batch(0))
    [gradient] = seen
    return gradient


def test_gradient_checkpointing_gives_the_same_gradients(model_dir: Path) -> None:
    plain = gradients(model_dir)
    checkpointed = gradients(model_dir, gradient_checkpointing=True)
    assert torch.allclose(checkpointed, plain, rtol=1e-4, atol=1e-9)
    assert float(plain.norm()) > 1e-3


def test_gradient_checkpointing_is_on_in_the_update(model_dir: Path) -> None:
    policy = load_policy(model_dir, "cpu")
    PolicyUpdater(policy.model, GRPOConfig(gradient_checkpointing=True))
    assert all(layer.gradient_checkpointing for layer in policy.model.model.layers)


def test_bfloat16_runs_and_is_close_to_float32(model_dir: Path) -> None:
    plain = gradients(model_dir)
    bf16 = gradients(model_dir, compute_dtype="bfloat16")
    assert not torch.equal(bf16, plain)  # it did compute in bfloat16
    assert float(torch.nn.functional.cosine_similarity(bf16, plain, dim=0)) > 0.99
    assert float(bf16.norm()) == pytest.approx(float(plain.norm()), rel=0.05)
    model, _, metrics = one_process(model_dir, [0], compute_dtype="bfloat16")
    assert all(t.dtype == torch.float32 for t in weights(model).values())  # the weights stay float32
    assert metrics[0]["optimizer_steps"] == 1.0


def test_row_share_deals_rows_out_and_pads_with_idle_micro_batches() -> None:
    from fulgor.algorithms.grpo.update import collate

    rows = collate(batch(0))
    first, second = RowShare(0, 2).parts(rows, 2), RowShare(1, 2).parts(rows, 2)
    assert len(first) == len(second) == 2
    assert [part.input_ids.shape[0] for part in first] == [2, 1]
    assert [part.input_ids.shape[0] for part in second] == [2, 1]
    assert float(second[-1].loss_mask.sum()) == 0  # idle: nothing trained
    trained = sum(float(part.loss_mask.sum()) for part in first + second)
    assert trained == float(rows.loss_mask.sum())
    with pytest.raises(ConfigError, match="rank must be in"):
        RowShare(2, 2)


def test_only_grpo_on_all_weights_is_sharded(monkeypatch: pytest.MonkeyPatch) -> None:
    from fulgor import GRPO, SFT
    from fulgor.weights.lora import LoraConfig

    check_shardable(GRPO())
    with pytest.raises(ConfigError, match="SFT trains in one process"):
        check_shardable(SFT(min_reward=1.0))
    with pytest.raises(ConfigError, match="LoRA adapter trains in one process"):
        check_shardable(GRPO(lora=LoraConfig()))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world_from_env() is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    world = world_from_env()
    assert world is not None
    assert world.rank == 1
    assert not world.leader


def test_verls_estimators_and_losses_are_not_sharded() -> None:
    pytest.importorskip("verl")
    from fulgor import GRPO
    from fulgor.algorithms.grpo.config import GRPOConfig

    for config in (GRPOConfig(advantage="verl:grpo"), GRPOConfig(policy_loss="verl:vanilla")):
        with pytest.raises(ConfigError, match=r"verl's .* train in one process"):
            check_shardable(GRPO(config=config))


@pytest.mark.gpu
def test_two_ranks_on_gpus_with_nccl(model_dir: Path, tmp_path: Path) -> None:
    """Two ranks on two GPUs (NCCL): the step is the one process's on the CPU, up to the GPUs' own
    float rounding."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs (one per rank)")
    run_ranks(model_dir, [job(model_dir, 0, [0], tmp_path / "gpus")], tmp_path, device="cuda")
    model, _, _ = one_process(model_dir, [0])
    on_gpus = weights(tmp_path / "gpus" / "step-1")
    assert max_difference(on_gpus, weights(model)) < 2e-3
    assert max_difference(on_gpus, weights(model_dir)) > 1e-3


def test_dev_and_evaluate_are_refused_on_ranks(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fulgor import GRPO, Trainer
    from fulgor.engine.local import EngineConfig

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    trainer = Trainer(
        algorithm=GRPO(), engine=EngineConfig(model=model_dir), run_dir=model_dir.parent / "run"
    )
    with pytest.raises(ConfigError, match=r"Trainer\.dev trains nothing"):
        trainer.dev(lambda task: 1.0, [{}])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Trainer\.evaluate trains nothing"):
        trainer.evaluate(lambda task: 1.0, [{}])  # type: ignore[arg-type]
    assert not (model_dir.parent / "run").exists()


def test_ranks_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from fulgor.training.checkpoints import set_torch_threads, usable_cores

    previous = torch.get_num_threads()
    try:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        assert set_torch_threads(None) == max(1, usable_cores() // 2)
        assert set_torch_threads(3) == 3
    finally:
        torch.set_num_threads(previous)
