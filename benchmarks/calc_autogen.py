"""The AutoGen calc agent against the plain-SDK calc demo: the same pipeline, side by side.

Usage::

    .venv/bin/python benchmarks/calc_autogen.py [--seed 0] [--plain-seconds 285] [--autogen-seconds 570]

Both runs are the calc demo's pipeline (:func:`examples.calc.train.run_demo`) on the same seed, in
``.bench/calc_autogen/{autogen,plain}`` (made afresh): ``fulgor model init``, the warm start on the
agent's own conversation, the held-out test split (greedy), GRPO with the demo's settings and a
time budget, and the test split again. One run trains the openai-SDK agent in runner processes on
this Python; the other the AutoGen ``AssistantAgent`` with its MCP calculator server, in runner
processes on the AutoGen environment's Python (``.frameworks/autogen``, or
``FULGOR_AUTOGEN_PYTHON``). The two run at the same time, each in a process of its own, so that a
machine other work keeps busy slows both alike; CPU seconds (the run's processes', which that
work inflates less than wall time) are reported beside wall seconds.

Reported: test accuracy before and after, GRPO steps, wall and CPU seconds, seconds per GRPO step
(median, validation not counted), CPU seconds per step (the GRPO stage's, validation included, over
its steps), lost tokens (the drift counters that must be zero), and from the validation curves
(greedy, every 10 steps) the step and GRPO seconds at which each run first reached the plain
demo's final test accuracy (within 2 points: a validation split of 64 problems moves in steps of
1.6), with CPU seconds to reach it estimated as that step times CPU seconds per step. The target:
the AutoGen agent reaches the plain demo's accuracy within 3 times its time (wall, and CPU), with
no token lost. The last line is ``RESULT ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _offline import go_offline  # noqa: E402
from examples.calc.train import DemoAgent, DemoResult, run_demo  # noqa: E402
from examples.calc_autogen.train import autogen_demo_agent  # noqa: E402
from fulgor.adapters import DriftReport  # noqa: E402

TOLERANCE = 0.02
TARGET_FACTOR = 3.0


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150, help="GRPO steps per run (at most)")
    parser.add_argument("--plain-seconds", type=float, default=285.0, help="the plain demo's GRPO budget")
    parser.add_argument("--autogen-seconds", type=float, default=570.0, help="the AutoGen run's GRPO budget")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "calc_autogen")
    parser.add_argument("--only", choices=["autogen", "plain"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only is not None:
        return run_one(args)
    command = [sys.executable, *sys.argv]
    names = ("autogen", "plain")
    print(f"running {', '.join(names)} side by side in {args.out}", flush=True)
    runs = [subprocess.Popen([*command, "--only", name]) for name in names]
    if any(run.wait() != 0 for run in runs):
        print("a run failed; its output is above", file=sys.stderr)
        return 1
    rows = {name: json.loads((args.out / f"{name}.json").read_text()) for name in names}
    print_table(rows, args.seed)
    return 0


def run_one(args: argparse.Namespace) -> int:
    """One pipeline, its summary written to ``OUT/NAME.json``."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    agent, seconds = {
        "autogen": (autogen_demo_agent(), args.autogen_seconds),
        "plain": (DemoAgent(), args.plain_seconds),
    }[args.only]
    run_dir = args.out / args.only
    shutil.rmtree(run_dir, ignore_errors=True)
    result = run_demo(
        run_dir,
        seed=args.seed,
        max_steps=args.steps,
        max_seconds=seconds,
        test_before=True,
        progress=False,
        agent=agent,
    )
    (args.out / f"{args.only}.json").write_text(json.dumps(summary(result)) + "\n")
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
        "grpo_cpu_s": result.cpu_seconds["grpo"],
        "cpu_per_step_s": result.cpu_seconds["grpo"] / len(trained),
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


def reached(curve: list[list[float]], accuracy: float) -> tuple[int, float] | None:
    """The step and GRPO seconds of the first validation at or above ``accuracy``; None if none is."""
    return next(((int(step), seconds) for step, seconds, value in curve if value >= accuracy), None)


def accuracy_at(curve: list[list[float]], seconds: float) -> float:
    """The validation accuracy of the last validation within ``seconds`` of GRPO."""
    return [value for _, at, value in curve if at <= seconds][-1]


def print_table(rows: dict[str, dict[str, Any]], seed: int) -> None:
    plain, autogen = rows["plain"], rows["autogen"]
    target = plain["after"] - TOLERANCE
    reach = {name: reached(row["curve"], target) for name, row in rows.items()}
    cpu_reach = {
        name: None if reach[name] is None else reach[name][0] * row["cpu_per_step_s"]  # type: ignore[index]
        for name, row in rows.items()
    }
    for name, row in rows.items():
        print(f"\n{name}: step, GRPO seconds, val accuracy")
        for step, seconds, value in row["curve"]:
            print(f"  {step:>4} {seconds:>6.0f}s  {value:.3f}")
    print(
        "\n| agent | test acc before | GRPO steps | GRPO wall | GRPO CPU | s/step | CPU s/step | "
        f"test acc after | val >= {target:.1%} at (step, wall, CPU) | lost tokens | failed rollouts |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        at = reach[name]
        when = "never" if at is None else f"step {at[0]}, {at[1]:.0f} s, {cpu_reach[name]:.0f} s"
        print(
            f"| {name} | {row['before']:.1%} | {row['steps']} | {row['grpo_s']:.0f} s | "
            f"{row['grpo_cpu_s']:.0f} s | {row['step_s']:.2f} | {row['cpu_per_step_s']:.2f} | "
            f"{row['after']:.1%} | {when} | {row['lost_tokens']} | {row['rollouts_failed']} |"
        )
    ratios = {"wall": None, "cpu": None}
    if reach["plain"] is not None and reach["autogen"] is not None:
        ratios["wall"] = reach["autogen"][1] / max(reach["plain"][1], 1e-9)
        ratios["cpu"] = cpu_reach["autogen"] / max(cpu_reach["plain"], 1e-9)  # type: ignore[operator]
    lost = plain["lost_tokens"] + autogen["lost_tokens"]
    met = all(r is not None and r <= TARGET_FACTOR for r in ratios.values()) and lost == 0
    shown = {k: "none" if r is None else f"{r:.2f}" for k, r in ratios.items()}
    print(
        f"RESULT seed={seed} plain_after={plain['after']:.3f} autogen_after={autogen['after']:.3f} "
        f"time_ratio_wall={shown['wall']} time_ratio_cpu={shown['cpu']} "
        f"autogen_val_at_plain_time={accuracy_at(autogen['curve'], plain['grpo_s']):.3f} "
        f"cpu_per_step_plain={plain['cpu_per_step_s']:.2f} "
        f"cpu_per_step_autogen={autogen['cpu_per_step_s']:.2f} "
        f"lost_tokens={lost} target_met={str(met).lower()}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
