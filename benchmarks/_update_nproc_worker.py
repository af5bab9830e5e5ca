"""One configuration of ``benchmarks/update_nproc.py``: GRPO update steps on one process, or on the
ranks of a torchrun (``fulgor.training.distributed``); prints one ``RESULT_JSON`` line (rank 0).

``_update_nproc_worker.py OPTIONS.json``: the model directory, the batch's shape and seed, the
update's options (``gradient_checkpointing``, ``compute_dtype``), warm-up and timed steps.
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fulgor import GRPO
from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater
from fulgor.training.distributed import (
    Ranks,
    ShardedUpdater,
    follow,
    process_group,
    sharded_trainable,
    world_from_env,
)
from fulgor.weights.policy import load_policy


def make_batch(options: dict[str, Any], vocab_size: int) -> list[Trajectory]:
    """``groups`` prompts x ``group_size`` completions, lengths and ids drawn from ``seed``."""
    rng = random.Random(options["seed"])
    trajectories = []
    for group in range(options["groups"]):
        prompt = [rng.randrange(3, vocab_size) for _ in range(rng.randint(48, 80))]
        for member in range(options["group_size"]):
            completion = [rng.randrange(3, vocab_size) for _ in range(rng.randint(32, 128))]
            n = len(prompt) + len(completion)
            row = TrajectoryRow(
                token_ids=prompt + completion,
                loss_mask=[0] * len(prompt) + [1] * len(completion),
                sampled_logprobs=[0.0] * len(prompt) + [rng.uniform(-9.0, -7.0) for _ in completion],
                calls=[0],
                returns=[0.0] * n,
            )
            trajectories.append(
                Trajectory(f"r{group}-{member}", f"g{group}", float(rng.random() < 0.5), [row], [])
            )
    return trajectories


def resident_mib() -> float:
    """This process's resident memory now."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_steps(
    updater: Any, trajectories: list[Trajectory], options: dict[str, Any]
) -> tuple[list[float], list[float]]:
    """Wall seconds and this process's CPU seconds of each step after the warm-up ones."""
    seconds, cpu_seconds = [], []
    for _ in range(options["warmup"] + options["steps"]):
        start, cpu_start = time.perf_counter(), time.process_time()
        updater.step(trajectories)
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    return seconds[options["warmup"] :], cpu_seconds[options["warmup"] :]


def count_cpu_seconds(cpu_seconds: list[float]) -> None:
    """Append this process's CPU seconds (all its threads) in each ``ShardedUpdater.step`` call,
    on every rank (the other ranks make theirs inside ``follow``)."""
    step = ShardedUpdater.step

    def counted(self: ShardedUpdater, trajectories: list[Trajectory]) -> dict[str, float]:
        start = time.process_time()
        try:
            return step(self, trajectories)
        finally:
            cpu_seconds.append(time.process_time() - start)

    ShardedUpdater.step = counted  # type: ignore[method-assign]


def main(path: str) -> None:
    options = json.loads(Path(path).read_text())
    torch.set_num_threads(options["threads"])
    model_dir = Path(options["model"])
    config = GRPOConfig(
        learning_rate=1e-5,
        micro_batch_size=options["micro_batch"],
        gradient_checkpointing=options["gradient_checkpointing"],
        compute_dtype=options["compute_dtype"],
    )
    world = world_from_env()
    if world is None:
        rest = resident_mib()  # before the model: what the update adds is peak - rest
        policy = load_policy(model_dir, "cpu")
        batch = make_batch(options, policy.model.config.vocab_size)
        seconds, cpu_seconds = timed_steps(PolicyUpdater(policy.model, config), batch, options)
        report(options, seconds, cpu_seconds, rest, peak_mib())
        return
    algorithm = GRPO(config=config)
    cpu_seconds: list[float] = []
    count_cpu_seconds(cpu_seconds)
    with process_group(world, "cpu") as device:
        ranks = Ranks(world, device)
        rest = resident_mib()
        seconds: list[float] = []
        if world.leader:
            try:
                policy, updater = sharded_trainable(algorithm, model_dir, model_dir, 0, ranks)
                batch = make_batch(options, policy.model.config.vocab_size)
                seconds, _ = timed_steps(updater, batch, options)
            finally:
                ranks.stop()
        else:
            follow(algorithm, model_dir, ranks)
        memory = torch.tensor([rest, peak_mib()], dtype=torch.float64)
        torch.distributed.all_reduce(memory, op=torch.distributed.ReduceOp.MAX)  # the largest rank's
        cpu = torch.tensor(cpu_seconds[options["warmup"] :], dtype=torch.float64)
        torch.distributed.all_reduce(cpu)  # each step's CPU seconds, all ranks together
        if world.leader:
            report(options, seconds, cpu.tolist(), float(memory[0]), float(memory[1]))


def report(
    options: dict[str, Any], seconds: list[float], cpu_seconds: list[float], rest: float, peak: float
) -> None:
    result = {
        "nproc": options["nproc"],
        "gradient_checkpointing": options["gradient_checkpointing"],
        "compute_dtype": options["compute_dtype"],
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "cpu_s": statistics.median(cpu_seconds),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "rest_mib": rest,
        "peak_mib": peak,
    }
    print("RESULT_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
