"""The AutoGen calc agent against the plain-SDK calc demo: the same pipeline, side by side.

Usage::

    .venv/bin/python benchmarks/calc_autogen.py [--seed 0] [--plain-seconds 285] [--autogen-seconds 570]

Both runs are the calc demo's pipeline (:func:`examples.calc.train.run_demo`) on the same seed, in
``.bench/calc_autogen/{autogen,plain}`` (made afresh): ``fulgor model init``, the warm start on the
agent's own conversation, the held-out test split (greedy), GRPO with the demo's settings and a
time budget, and the test split again. One run trains the openai-SDK agent in runner processes on
this Python; the other the AutoGen ``AssistantAgent`` with its MCP calculator server, in runner
processes on the AutoGen environment's Python (``.frameworks/autogen``, or
``FULGOR_AUTOGEN_PYTHON``).

Reported: test accuracy before and after, GRPO steps and seconds, seconds per GRPO step (median,
validation not counted) and in collecting rollouts, lost tokens (the drift counters that must be
zero), and from the validation curves (greedy, every 10 steps) the GRPO seconds each run took to
reach the plain demo's final test accuracy (within 2 points, a validation split of 64 problems
moving in steps of 1.6), and the AutoGen run's validation accuracy at the plain run's full GRPO
time. The target: the AutoGen agent reaches the plain demo's accuracy within 3 times its time, with
no token lost. The last line is ``RESULT ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.calc.train import DemoAgent, DemoResult, run_demo  # noqa: E402
from examples.calc_autogen.train import autogen_demo_agent  # noqa: E402
from fulgor.adapters import DriftReport  # noqa: E402

TOLERANCE = 0.02
TARGET_FACTOR = 3.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150, help="GRPO steps per run (at most)")
    parser.add_argument("--plain-seconds", type=float, default=285.0, help="the plain demo's GRPO budget")
    parser.add_argument("--autogen-seconds", type=float, default=570.0, help="the AutoGen run's GRPO budget")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "calc_autogen")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    runs = {
        "autogen": (autogen_demo_agent(), args.autogen_seconds),
        "plain": (DemoAgent(), args.plain_seconds),
    }
    rows: dict[str, dict[str, Any]] = {}
    for name, (agent, seconds) in runs.items():
        run_dir = args.out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"{name}: {run_dir} (GRPO for at most {seconds:.0f} s)", flush=True)
        result = run_demo(
            run_dir,
            seed=args.seed,
            max_steps=args.steps,
            max_seconds=seconds,
            test_before=True,
            progress=False,
            agent=agent,
        )
        rows[name] = summary(result)
        print(json.dumps(rows[name]), flush=True)
    print_table(rows, args.seed)
    return 0


def summary(result: DemoResult) -> dict[str, Any]:
    """One run's figures: accuracies, time, step cost, lost tokens and the validation curve."""
    trained = [m for m in result.history if m["step"] > 0]
    step_seconds = [
        sum(v for k, v in m.items() if k.startswith("seconds/") and k != "seconds/validate") for m in trained
    ]
    return {
        "warm_start_s": round(result.seconds["warm_start"]),
        "before": result.test_before["val_accuracy"],
        "after": result.test_after["val_accuracy"],
        "after_tools": result.test_after.get("val_tool_call_rate"),
        "steps": len(trained),
        "grpo_s": trained[-1]["elapsed_seconds"],
        "step_s": statistics.median(step_seconds),
        "collect_s": statistics.median(m.get("seconds/collect_rollouts", 0.0) for m in trained),
        "lost_tokens": sum(m.get(f"drift/{name}", 0) for m in trained for name in DriftReport.LOSSES),
        "rollouts_failed": sum(m.get("rollouts_failed", 0) for m in trained),
        "curve": [
            (m["step"], m["elapsed_seconds"] if m["step"] else 0.0, m["val_accuracy"])
            for m in result.history
            if "val_accuracy" in m
        ],
    }


def seconds_to_reach(curve: list[tuple[int, float, float]], accuracy: float) -> float | None:
    """GRPO seconds at the first validation at or above ``accuracy``; None if none is."""
    return next((seconds for _, seconds, value in curve if value >= accuracy), None)


def accuracy_at(curve: list[tuple[int, float, float]], seconds: float) -> float:
    """The validation accuracy of the last validation within ``seconds`` of GRPO."""
    return [value for _, at, value in curve if at <= seconds][-1]


def print_table(rows: dict[str, dict[str, Any]], seed: int) -> None:
    plain, autogen = rows["plain"], rows["autogen"]
    target = plain["after"] - TOLERANCE
    reach = {name: seconds_to_reach(row["curve"], target) for name, row in rows.items()}
    for name, row in rows.items():
        print(f"\n{name}: step, GRPO seconds, val accuracy")
        for step, seconds, value in row["curve"]:
            print(f"  {step:>4} {seconds:>6.0f}s  {value:.3f}")
    print(
        "\n| agent | warm start | test acc before | GRPO steps | GRPO wall | s/step | collect s/step | "
        f"test acc after | val >= {target:.1%} at | lost tokens | failed rollouts |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        reached = "never" if reach[name] is None else f"{reach[name]:.0f} s"
        print(
            f"| {name} | {row['warm_start_s']} s | {row['before']:.1%} | {row['steps']} | "
            f"{row['grpo_s']:.0f} s | {row['step_s']:.2f} | {row['collect_s']:.2f} | {row['after']:.1%} | "
            f"{reached} | {row['lost_tokens']} | {row['rollouts_failed']} |"
        )
    at_equal_time = accuracy_at(autogen["curve"], plain["grpo_s"])
    ratio = None
    if reach["plain"] is not None and reach["autogen"] is not None:
        ratio = reach["autogen"] / max(reach["plain"], 1e-9)
    lost = plain["lost_tokens"] + autogen["lost_tokens"]
    met = ratio is not None and ratio <= TARGET_FACTOR and lost == 0
    ratio_text = "none" if ratio is None else f"{ratio:.2f}"
    print(
        f"RESULT seed={seed} plain_after={plain['after']:.3f} autogen_after={autogen['after']:.3f} "
        f"plain_reach_s={reach['plain']} autogen_reach_s={reach['autogen']} time_ratio={ratio_text} "
        f"autogen_val_at_plain_time={at_equal_time:.3f} "
        f"step_s_plain={plain['step_s']:.2f} step_s_autogen={autogen['step_s']:.2f} "
        f"lost_tokens={lost} target_met={str(met).lower()}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
