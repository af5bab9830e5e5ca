"""Does the RAG demo learn? Held-out answer F1 before and after GRPO, and searches per question.

Usage::

    .venv/bin/python benchmarks/rag.py [--seeds 0 1 2] [--steps 300] [--quick]

For each seed, in ``.bench/rag/seed-N`` (made afresh): the world, its passages and their FTS5
index are generated, the tiny model is built, the warm start fine-tunes it on synthetic searches
(:mod:`examples.rag.warm_start`), and the held-out test split (people training never saw) is run
greedy through the whole system (store, gateway, engine, runner processes, the unchanged OpenAI
Agents SDK agent and its MCP search server). Then GRPO with the demo's settings
(:func:`examples.rag.train.demo_grpo`) trains for at most 285 s of wall time, validation included
(the target allows 10 minutes), and the test split is run again with the final weights.
Validation (greedy, the val split) gives the curves: answer F1 and searches per question, step by
step.

Acceptance (medians over the seeds): the held-out F1 at least doubles, and ends at 0.6 or more,
after at most 10 minutes of GRPO; the drift counters that mean lost or mismatched tokens
(:attr:`fulgor.adapters.DriftReport.LOSSES`) are zero at every step. The last line is
``RESULT ...``. ``--quick`` runs one seed with a few steps on small splits: it checks the script,
not the learning.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _offline import go_offline  # noqa: E402
from examples.rag.train import SIZES, run_demo  # noqa: E402
from examples.rag.warm_start import WarmStartConfig  # noqa: E402
from fulgor.adapters import DriftReport  # noqa: E402
from fulgor.training.run_report import read_metrics  # noqa: E402


def lost_tokens(run_dir: Path) -> int:
    """The DriftReport.LOSSES counters summed over the run's metrics.jsonl."""
    history = read_metrics(run_dir)
    return sum(int(m.get(f"drift/{name}", 0)) for m in history for name in DriftReport.LOSSES)


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300, help="GRPO steps (at most; 285 s)")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "rag")
    parser.add_argument("--quick", action="store_true", help="one seed, a few steps, small splits")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    options: dict[str, Any] = {"max_steps": args.steps, "sizes": SIZES}
    seeds = args.seeds
    if args.quick:
        seeds = seeds[:1]
        options = {"max_steps": 2, "sizes": (24, 8, 8), "max_seconds": None}
    rows = []
    started_all = time.perf_counter()
    for seed in seeds:
        run_dir = args.out / f"seed-{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"seed {seed}: {run_dir}", flush=True)
        warm = WarmStartConfig(seed=seed)
        if args.quick:
            warm = WarmStartConfig(seed=seed, full_steps=2, steps=4, batch_size=4)
        result = run_demo(run_dir, seed=seed, warm=warm, test_before=True, progress=False, **options)
        trained = [m for m in result.history if m["step"] > 0]
        row = {
            "seed": seed,
            "warm_start_s": result.seconds["warm_start"],
            "steps": len(trained),
            "grpo_s": trained[-1]["elapsed_seconds"] if trained else 0.0,
            "before": result.test_before["val_f1"],
            "after": result.test_after["val_f1"],
            "searches_before": result.test_before["val_tool_calls"],
            "searches_after": result.test_after["val_tool_calls"],
            # GRPO's rollouts that failed, and the held-out test's after it
            "failed": sum(m.get("rollouts_failed", 0) for m in trained)
            + result.test_after["val_rollouts_failed"],
            "lost": lost_tokens(run_dir / "grpo"),
        }
        rows.append(row)
        print(f"  seed {seed}: step, GRPO seconds, val F1, val searches per question")
        for m in result.history:
            if "val_f1" in m:
                seconds = round(m["elapsed_seconds"]) if m["step"] else 0
                print(f"    {m['step']:>3} {seconds:>5}s  {m['val_f1']:.3f}  {m['val_tool_calls']:.2f}")
        print(f"  test F1 {row['before']:.3f} -> {row['after']:.3f}; lost tokens {row['lost']}", flush=True)

    print(f"\n{time.strftime('%Y-%m-%d')}, {time.perf_counter() - started_all:.0f} s in all")
    print("\n| seed | warm start | test F1 before | searches before | GRPO steps | GRPO wall | test F1 after "
          "| searches after | failed rollouts | lost tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['warm_start_s']:.0f} s | {r['before']:.2f} | {r['searches_before']:.2f} | "
            f"{r['steps']} | {r['grpo_s']:.0f} s | {r['after']:.2f} | {r['searches_after']:.2f} | "
            f"{r['failed']} | {r['lost']} |"
        )
    before = statistics.median(r["before"] for r in rows)
    after = statistics.median(r["after"] for r in rows)
    grpo_s = max(r["grpo_s"] for r in rows)
    lost = sum(r["lost"] for r in rows)
    met = after >= 2 * before and after >= 0.6 and grpo_s <= 600 and lost == 0
    print(
        f"RESULT f1_before={before:.2f} f1_after={after:.2f} "
        f"searches_before={statistics.median(r['searches_before'] for r in rows):.2f} "
        f"searches_after={statistics.median(r['searches_after'] for r in rows):.2f} "
        f"lost_tokens={lost} grpo_seconds_max={grpo_s:.0f} seeds={len(rows)} target_met={str(met).lower()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
