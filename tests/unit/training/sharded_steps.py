"""Run under torchrun by ``test_distributed.py``: GRPO steps of the update across processes.

``sharded_steps.py JOBS.json`` runs each job in turn on the same ranks (on ``device``: the CPU by
default, ``cuda`` for one GPU per rank): every rank loads the job's
``start`` (a model directory, or a checkpoint of step ``start_step``), rank 0 leads one update per
batch of ``offsets`` and saves each as ``checkpoints/step-N`` (as the Trainer does), the other
ranks follow; rank 0 writes each step's metrics to ``checkpoints/metrics.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from sharded_rows import batch

from fulgor import GRPO
from fulgor.algorithms.grpo import GRPOConfig
from fulgor.training.distributed import Ranks, follow, process_group, sharded_trainable, world_from_env


def main(jobs_path: str) -> None:
    torch.set_num_threads(1)
    options = json.loads(Path(jobs_path).read_text())
    world = world_from_env()
    assert world is not None, "run under torchrun"
    base = Path(options["base"])
    with process_group(world, options.get("device", "cpu")) as device:
        for job in options["jobs"]:
            ranks = Ranks(world, device)
            algorithm = GRPO(config=GRPOConfig(**job["config"]))
            if not world.leader:
                follow(algorithm, base, ranks)
                continue
            try:
                lead(algorithm, base, job, ranks)
            finally:
                ranks.stop()


def lead(algorithm: GRPO, base: Path, job: dict[str, Any], ranks: Ranks) -> None:
    start, step, checkpoints = Path(job["start"]), job["start_step"], Path(job["checkpoints"])
    policy, updater = sharded_trainable(algorithm, start, base, step, ranks)
    metrics = []
    for offset in job["offsets"]:
        metrics.append(updater.step(batch(offset, flat=job.get("flat", False))))
        step += 1
        policy.save(checkpoints, step, {"updater": updater.state_dict()})
    (checkpoints / "metrics.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main(sys.argv[1])
