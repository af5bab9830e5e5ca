"""The GRPO update on one process against two ranks (FSDP2, gloo), with and without gradient
checkpointing, in float32 and under bfloat16 autocast: step time and peak memory.

Usage::

    .venv/bin/python benchmarks/update_nproc.py [--size small] [--steps 3] [--warmup 1] [--cores 2]
        [--repeats 1]

Every configuration runs in fresh processes (``benchmarks/_update_nproc_worker.py``: directly for one
process, under ``torch.distributed.run`` for two ranks, meeting on loopback as ``fulgor train
--nproc``'s do) on the same locally built Llama
(``init_model``) and the same batch (``--groups`` prompts of 48-80 tokens x ``--group-size``
completions of 32-128 tokens, ids and lengths drawn once, seeded), micro-batches of
``--micro-batch`` rows. The cores are shared out: one process gets ``--cores`` torch threads, each of
two ranks half of them (at least one each). Each configuration runs ``--warmup`` untimed steps, then
``--steps`` timed ones, ``--repeats`` times (the configurations in turn, the order reversed on every
other round, so that other work on the machine falls on all of them); the step time is the median
over every timed step, on rank 0, from the call to ``step`` (on two ranks: sending the
trajectories to the other rank included) to its return, and the CPU time is the median over the
steps of the CPU seconds of every rank's process in its ``step`` (all threads; on a machine shared
with other work it moves less than the wall time does). Memory is resident memory (RSS): the peak over
the process's life minus what it held before loading the model (torch and the libraries), the larger
of the two ranks'. The last line is machine-readable::

    RESULT <config>_s=<median> <config>_mib=<peak above rest> ...

The single process takes fulgor's usual path (shared prompts computed once, the LM head at trained
positions only); two ranks take the plain forward of the sharded model (full logits), so the two
differ in the work per row as well as in how it is spread.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _offline import go_offline
from fulgor.training.distributed import local_torchrun

HERE = Path(__file__).resolve().parent


def run_configuration(options: dict[str, Any], folder: Path) -> dict[str, Any]:
    """One configuration in fresh processes; its RESULT_JSON."""
    path = folder / f"options-{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps(options))
    worker = str(HERE / "_update_nproc_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": str(options["threads"])}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, worker, str(path)]
    if options["nproc"] > 1:  # the ranks of fulgor train --nproc, meeting on loopback only
        ranks = folder / f"ranks-{path.stem}"
        ranks.mkdir()
        torchrun, environment = local_torchrun(options["nproc"], ranks)
        command = [sys.executable, "-m", "torch.distributed.run", *torchrun, worker, str(path)]
        env.update(environment)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT_JSON ")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"configuration {options} failed:\n{result.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT_JSON "))
    return found


def name(result: dict[str, Any]) -> str:
    checkpointing = "gc" if result["gradient_checkpointing"] else "nogc"
    dtype = "bf16" if result["compute_dtype"] == "bfloat16" else "fp32"
    return f"nproc{result['nproc']}_{checkpointing}_{dtype}"


def main(argv: list[str] | None = None) -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", choices=("tiny", "small"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    from fulgor.engine.models import init_model

    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        model = init_model(folder / "model", args.size, seed=args.seed)
        (folder / "options").mkdir()
        configurations = list(itertools.product((1, 2), (False, True), ("float32", "bfloat16")))
        runs: dict[tuple[Any, ...], list[dict[str, Any]]] = {c: [] for c in configurations}
        for round_ in range(args.repeats):
            for nproc, checkpointing, dtype in configurations[:: -1 if round_ % 2 else 1]:
                options = {
                    "model": str(model), "nproc": nproc, "threads": max(1, args.cores // nproc),
                    "gradient_checkpointing": checkpointing, "compute_dtype": dtype, "steps": args.steps,
                    "warmup": args.warmup, "groups": args.groups, "group_size": args.group_size,
                    "micro_batch": args.micro_batch, "seed": args.seed,
                }  # fmt: skip
                result = run_configuration(options, folder / "options")
                runs[nproc, checkpointing, dtype].append(result)
                print(json.dumps(result), flush=True)
    print_table([merge(results) for results in runs.values()])
    return 0


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's rounds as one: medians over every step, the largest memory."""
    return {
        **results[0],
        "median_s": statistics.median(s for r in results for s in r["seconds"]),
        "min_s": min(r["min_s"] for r in results),
        "max_s": max(r["max_s"] for r in results),
        "cpu_s": statistics.median(s for r in results for s in r["cpu_seconds"]),
        "rest_mib": max(r["rest_mib"] for r in results),
        "peak_mib": max(r["peak_mib"] for r in results),
    }


def print_table(results: list[dict[str, Any]]) -> None:
    base = next(r for r in results if name(r) == "nproc1_nogc_fp32")
    columns = (
        "processes", "gradient checkpointing", "compute", "s/step (median, min-max)", "vs 1 process fp32",
        "CPU s/step (all ranks)", "vs 1 process fp32", "peak MiB above rest", "vs 1 process fp32",
    )  # fmt: skip
    print("\n| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        memory = r["peak_mib"] - r["rest_mib"]
        base_memory = base["peak_mib"] - base["rest_mib"]
        spread = f"{r['median_s']:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f})"
        ratio = r["median_s"] / base["median_s"]
        print(
            f"| {r['nproc']} | {'on' if r['gradient_checkpointing'] else 'off'} | {r['compute_dtype']} | "
            f"{spread} | {ratio:.2f}x | {r['cpu_s']:.3f} | {r['cpu_s'] / base['cpu_s']:.2f}x | "
            f"{memory:.0f} | {memory / base_memory:.2f}x |"
        )
    fields = [f"{name(r)}_cpu_s={r['cpu_s']:.3f}" for r in results] + [
        f"{name(r)}_s={r['median_s']:.3f} {name(r)}_mib={r['peak_mib'] - r['rest_mib']:.0f}" for r in results
    ]
    print("\nRESULT " + " ".join(fields))


if __name__ == "__main__":
    sys.exit(main())
