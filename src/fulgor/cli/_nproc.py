"""``fulgor train``'s options for the policy update: ``--nproc`` (the update across processes under
torchrun), ``--gradient-checkpointing`` and ``--compute-dtype``; their checks, and the torchrun that
runs the command again on ``--nproc`` ranks."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from fulgor.cli._options import positive_int
from fulgor.errors import ConfigError

__all__ = ["COMPUTE_DTYPES", "add_update_arguments", "check_update_options", "rank", "run_ranks"]

COMPUTE_DTYPES = ("float32", "bfloat16")


def add_update_arguments(grpo: Any, system: Any) -> None:
    """GRPO's update options into the ``grpo`` group, ``--nproc`` into ``system``."""
    grpo.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="GRPO: recompute each decoder layer's activations in the backward (less memory, more compute)",
    )
    grpo.add_argument(
        "--compute-dtype",
        choices=COMPUTE_DTYPES,
        default="float32",
        help="GRPO and SFT: the update's forward and backward in float32 (default) or under bfloat16 "
        "autocast (weights and optimiser stay float32)",
    )
    system.add_argument(
        "--nproc",
        type=positive_int,
        default=1,
        metavar="N",
        help="processes for the GRPO update (default 1): runs under torchrun, rank 0 runs the services "
        "and rollouts, each rank trains its share of every step's rows on its shard of the weights "
        "(FSDP2; gloo on the CPU, NCCL with one GPU per rank)",
    )


def run_ranks(args: argparse.Namespace, run_dir: Path) -> int:
    """The same command on ``--nproc`` ranks under torchrun (on this machine), all with ``run_dir``;
    its exit status (torchrun's: 1 when a rank failed; 130 once interrupted).

    torchrun runs in a session of its own (:mod:`fulgor.cli._torchrun`), so that a terminal's Ctrl+C
    reaches this process only, which passes it on once and waits for the ranks to stop; torchrun
    stops them too when this process ends without that (SIGTERM, SIGKILL), as it watches a pipe
    only this process holds."""
    from fulgor.cli import _torchrun
    from fulgor.training.distributed import local_torchrun

    argv = _without_nproc(args.argv)  # the ranks take their number from torchrun's WORLD_SIZE
    if args.run_dir is None:
        argv += ["--run-dir", str(run_dir)]
    with tempfile.TemporaryDirectory(prefix="fulgor-ranks-") as folder:  # where the ranks meet
        options, environment = local_torchrun(args.nproc, Path(folder))
        read_fd, write_fd = os.pipe()  # the write end stays here, not inherited
        try:
            process = subprocess.Popen(
                _torchrun.command_line(read_fd, [*options, "-m", "fulgor.cli.main", *argv]),
                pass_fds=(read_fd,),
                start_new_session=True,
                env={**os.environ, **environment},
            )
        finally:
            os.close(read_fd)
        return _wait_for_ranks(process, write_fd)


def _wait_for_ranks(process: subprocess.Popen[bytes], write_fd: int) -> int:
    """torchrun's exit status once it ends; a Ctrl+C here is passed on to it once."""
    interrupted = False
    while True:
        try:
            code = process.wait()
            break
        except KeyboardInterrupt:  # torchrun stops the ranks; rank 0 says how to continue
            if not interrupted:
                interrupted = True
                process.send_signal(signal.SIGINT)
    os.close(write_fd)
    return 130 if interrupted else code


def _without_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc N`` (torchrun's own parser takes ``--nproc`` for an abbreviation of
    its ``--nproc-per-node``, wherever it stands)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def check_update_options(args: argparse.Namespace) -> None:
    """GRPO's update options go with GRPO; ``--nproc`` > 1 trains GRPO (the ranks share the update
    only), and matches torchrun's ``WORLD_SIZE`` when the command runs as one of
    its ranks."""
    training = not (args.dev or args.evaluate)
    if training and args.algorithm != "grpo" and args.gradient_checkpointing:
        raise ConfigError("--gradient-checkpointing sets GRPO's update; pass it with --algorithm grpo")
    if training and args.algorithm not in ("grpo", "sft") and args.compute_dtype != "float32":
        raise ConfigError(
            "--compute-dtype sets the update of GRPO and SFT; pass it with --algorithm grpo or sft"
        )
    if args.nproc == 1:
        return
    if not training:
        raise ConfigError("--nproc runs the update across processes; --dev and --evaluate train nothing")
    if args.algorithm != "grpo":
        raise ConfigError(
            f"--nproc shards GRPO's update across processes; --algorithm {args.algorithm} trains in one "
            "process: drop --nproc"
        )
    world_size = os.environ.get("WORLD_SIZE")
    if world_size is not None and int(world_size) != args.nproc:  # a torchrun the user started
        raise ConfigError(
            f"--nproc {args.nproc} runs under a torchrun of {world_size} processes; pass the same "
            "number, or run fulgor train --nproc N without torchrun (it starts torchrun itself)"
        )
