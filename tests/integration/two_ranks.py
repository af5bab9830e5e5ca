"""Run under torchrun by ``test_loopback.py``: two ranks meet as ``fulgor train --nproc``'s do
(:func:`fulgor.training.distributed.process_group` under :func:`~fulgor.training.distributed.local_torchrun`)
and sum a tensor; each prints ``rank R: SUM``."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fulgor.training.distributed import process_group, world_from_env


def main() -> None:
    world = world_from_env()
    assert world is not None, "run under torchrun"
    with process_group(world, "cpu"):
        total = torch.ones(1)
        dist.all_reduce(total)
        print(f"rank {world.rank}: {total.item()}", flush=True)


if __name__ == "__main__":
    main()
