"""The GRPO update on a real model: trained tokens/s of all weights against a LoRA adapter.

Usage::

    .venv/bin/python benchmarks/lora_update.py --model DIR [--rank 16] [--repeats 3] [--threads 2]

``DIR`` is a model directory, e.g. SmolLM2-135M-Instruct made from its GGUF file by ``fulgor model
import`` (the question this answers: on a CPU, what does training only an adapter buy on such a
model?). Both sides run fulgor's ``PolicyUpdater.step`` on the same batch, built as
``benchmarks/grpo_step.py`` builds it (``--groups`` prompts of 200 to 300 tokens x ``--group-size``
completions of 40 to 80, the lengths of the calc agent's calls on SmolLM2), in float32 with the
same torch thread count: one on the model's weights (AdamW over all of them), one on the same
weights wrapped with a fresh LoRA adapter of ``--rank`` on every linear layer but the output head
(``fulgor.weights.lora.add_adapter``; AdamW over the adapter only). Each repetition loads the
model afresh for each side, runs one untimed step and times ``--steps``; the sides alternate per
repetition. Trained tokens/s is from the median step's wall-clock time; the optimiser state each
side keeps (what a checkpoint of it holds besides the weights) is printed too.

Prints a table and ends with one ``RESULT name=value ...`` line; no target: it measures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from _offline import go_offline
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater
from fulgor.weights.lora import LoraConfig, add_adapter
from grpo_step import Spec, make_batch, trained_tokens, trajectories

LEARNING_RATE = 1e-5


def updater_for(
    model_dir: Path, rank: int | None, spec: Spec, device: str = "cpu", compute_dtype: str = "float32"
) -> tuple[PolicyUpdater, Any]:
    """The model's float32 weights on ``device`` (with a fresh adapter of ``rank``) and an updater;
    ``compute_dtype`` is the update's autocast (``GRPOConfig.compute_dtype``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to(device)
    if rank is not None:
        model = add_adapter(model, LoraConfig(rank=rank, alpha=2.0 * rank), model_dir)
    config = GRPOConfig(
        learning_rate=LEARNING_RATE, micro_batch_size=spec.micro_batch, compute_dtype=compute_dtype
    )
    return PolicyUpdater(model, config), model


def optimiser_megabytes(updater: PolicyUpdater) -> float:
    state = updater.optimizer.state_dict()["state"]
    size = sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))
    return size / 2**20


def timed_steps(
    model_dir: Path,
    rank: int | None,
    spec: Spec,
    groups: list[dict[str, Any]],
    device: str = "cpu",
    compute_dtype: str = "float32",
) -> tuple[list[float], float]:
    """One untimed step, then ``spec.steps`` timed ones: their seconds, and the optimiser state's MB."""
    updater, model = updater_for(model_dir, rank, spec, device, compute_dtype)
    batch = trajectories(groups)
    seconds = []
    for i in range(1 + spec.steps):
        started = time.perf_counter()
        metrics = updater.step(batch)
        if device.startswith("cuda"):
            torch.cuda.synchronize()  # the step's kernels done, not only queued
        elapsed = time.perf_counter() - started
        if metrics["trained_tokens"] != trained_tokens(groups):
            raise RuntimeError(
                f"trained {metrics['trained_tokens']} tokens, expected {trained_tokens(groups)}"
            )
        if i >= 1:
            seconds.append(elapsed)
    megabytes = optimiser_megabytes(updater)
    del updater, model
    return seconds, megabytes


def main() -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="a model directory")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per repetition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = Spec(args.groups, args.group_size, 200, 300, 40, 80, args.micro_batch, args.threads, 1, args.steps)
    from transformers import AutoTokenizer

    groups = make_batch(spec, AutoTokenizer.from_pretrained(args.model))
    tokens = trained_tokens(groups)
    sides: dict[str, list[float]] = {"full": [], f"lora_r{args.rank}": []}
    state: dict[str, float] = {}
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for side in order:
            seconds, state[side] = timed_steps(
                args.model, None if side == "full" else args.rank, spec, groups
            )
            sides[side] += seconds
            print(f"  repeat {repeat} {side}: {', '.join(f'{s:.2f}' for s in seconds)} s/step", flush=True)
    print(
        f"\n{args.model.name}: {spec.sequences} sequences a step, {tokens} trained tokens, float32, "
        f"{args.threads} threads; median of {args.repeats} x {args.steps} steps"
    )
    header = f"{'side':<10} | {'s/step':>7} | {'tokens/s':>8} | {'optimiser state MB':>18}"
    print(header)
    print("-" * len(header))
    rates = {}
    for side, seconds in sides.items():
        rates[side] = tokens / statistics.median(seconds)
        print(f"{side:<10} | {statistics.median(seconds):>7.2f} | {rates[side]:>8.0f} | {state[side]:>18.1f}")
    lora = f"lora_r{args.rank}"
    fields = {
        "model": args.model.name,
        "full_tokens_per_s": f"{rates['full']:.0f}",
        f"{lora}_tokens_per_s": f"{rates[lora]:.0f}",
        "lora_vs_full": f"{rates[lora] / rates['full']:.2f}",
        "full_state_mb": f"{state['full']:.0f}",
        f"{lora}_state_mb": f"{state[lora]:.1f}",
    }
    print("RESULT " + " ".join(f"{name}={value}" for name, value in fields.items()))


if __name__ == "__main__":
    main()
