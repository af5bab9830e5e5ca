"""Does the CrewAI crew learn? The training reward step by step, and held-out accuracy before and
after a short GRPO run through the unchanged crew.

Usage::

    .venv/bin/python benchmarks/crew.py [--seeds 0] [--steps 150] [--quick]

For each seed, in ``.bench/crew/seed-N`` (made afresh): the tiny model is built, warm-started on
synthetic crew runs (:mod:`examples.crew.warm_start`), and trained with GRPO
(:func:`examples.crew.train.crew_grpo`: steps of 64 rollouts, each a crew run in a runner process on
CrewAI's Python, whose solver and reporter call the local engine through the gateway; at most 285 s
of GRPO, validation included). Validation (greedy, 64 held-out problems) runs before the first
step, every 10 steps and after the last.

Acceptance: held-out accuracy after GRPO at least 25 points above the warm start's, the mean
training reward of the last third of the steps at least 0.2 above the first third's, and no lost or
mismatched token at any step (:attr:`fulgor.adapters.DriftReport.LOSSES`). The last line is
``RESULT ...``. ``--quick`` runs a few steps on small splits: it checks the script, not the learning.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _offline import go_offline  # noqa: E402
from examples.crew.train import SIZES, run_crew  # noqa: E402
from examples.crew.warm_start import WarmStartConfig  # noqa: E402
from fulgor.adapters import DriftReport  # noqa: E402
from fulgor.training.run_report import read_metrics  # noqa: E402


def lost_tokens(run_dir: Path) -> int:
    """The DriftReport.LOSSES counters summed over the run's metrics.jsonl."""
    history = read_metrics(run_dir)
    return sum(int(m.get(f"drift/{name}", 0)) for m in history for name in DriftReport.LOSSES)


def third_means(rewards: list[float]) -> tuple[float, float]:
    """The mean reward of the first and of the last third of the steps."""
    third = max(1, len(rewards) // 3)
    return statistics.fmean(rewards[:third]), statistics.fmean(rewards[-third:])


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=150, help="GRPO steps at most")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "crew")
    parser.add_argument("--quick", action="store_true", help="a few steps on small splits")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("examples").setLevel(logging.INFO)  # the warm start's loss, the stages
    options: dict[str, Any] = {"max_steps": args.steps, "sizes": SIZES}
    if args.quick:
        options = {"max_steps": 2, "sizes": (32, 4, 0), "val_every": 1, "max_seconds": None}
    rows = []
    started_all = time.perf_counter()
    for seed in args.seeds:
        run_dir = args.out / f"seed-{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"seed {seed}: {run_dir}", flush=True)
        warm = (
            WarmStartConfig(seed=seed, tool_steps=20, steps=30) if args.quick else WarmStartConfig(seed=seed)
        )
        result = run_crew(run_dir, seed=seed, warm=warm, progress=False, **options)
        trained = [m for m in result.history if m["step"] > 0]
        validated = [m for m in result.history if "val_accuracy" in m]
        rewards = [m["reward_mean"] for m in trained]
        first, last = third_means(rewards)
        row = {
            "seed": seed,
            "warm_start_s": result.seconds["warm_start"],
            "steps": len(trained),
            "grpo_s": result.seconds["grpo"],
            "val_before": validated[0]["val_accuracy"],
            "val_after": validated[-1]["val_accuracy"],
            "tools_before": validated[0]["val_tool_call_rate"],
            "tools_after": validated[-1]["val_tool_call_rate"],
            "reward_first": first,
            "reward_last": last,
            "failed": sum(int(m.get("rollouts_failed", 0)) for m in trained),
            "lost": lost_tokens(run_dir / "grpo"),
        }
        rows.append(row)
        print(f"  seed {seed}: step, reward (64 rollouts, temperature 1), tool-call rate, val accuracy")
        for m in result.history:
            reward = f"{m['reward_mean']:.3f}" if "reward_mean" in m else "  -  "
            tools = f"{m['tool_call_rate']:.2f}" if "tool_call_rate" in m else "  - "
            val = f"{m['val_accuracy']:.1%}" if "val_accuracy" in m else ""
            print(f"    {m['step']:>3}  {reward}  {tools}  {val}", flush=True)

    print(f"\n{time.strftime('%Y-%m-%d')}, {time.perf_counter() - started_all:.0f} s in all")
    print("\n| seed | warm start | val acc before | val tool rate before | GRPO steps | GRPO wall "
          "| reward, first third | reward, last third | val acc after | val tool rate after "
          "| failed rollouts | lost tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['warm_start_s']:.0f} s | {r['val_before']:.1%} | {r['tools_before']:.1%} | "
            f"{r['steps']} | {r['grpo_s']:.0f} s | {r['reward_first']:.3f} | {r['reward_last']:.3f} | "
            f"{r['val_after']:.1%} | {r['tools_after']:.1%} | {r['failed']} | {r['lost']} |"
        )
    before = statistics.median(r["val_before"] for r in rows)
    after = statistics.median(r["val_after"] for r in rows)
    first = statistics.median(r["reward_first"] for r in rows)
    last = statistics.median(r["reward_last"] for r in rows)
    lost = sum(r["lost"] for r in rows)
    met = after >= before + 0.25 and last >= first + 0.2 and lost == 0
    print(
        f"RESULT val_before={before:.3f} val_after={after:.3f} reward_first_third={first:.3f} "
        f"reward_last_third={last:.3f} lost_tokens={lost} seeds={len(rows)} target_met={str(met).lower()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
