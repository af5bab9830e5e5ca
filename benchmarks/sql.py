"""Does the SQL demo learn, and does it matter which agents' calls GRPO trains? Several seeds.

Usage::

    .venv/bin/python benchmarks/sql.py [--seeds 0 1 2] [--steps 300] [--quick]

For each seed, in ``.bench/sql/seed-N`` (made afresh): the company database and the tiny model are
built, the warm start fine-tunes it on synthetic solutions (:mod:`examples.sql.warm_start`), and the
held-out test split is run greedy through the whole system (store, gateway, engine, runner
processes, the unchanged LangGraph agent). Then, from that same warm start, side by side, one after
the other, GRPO with the demo's settings (:func:`examples.sql.train.demo_grpo`) trains

* ``writer+rewriter``: ``agent_match="write|rewrite"``, the writer's and the rewriter's calls (the
  checker's are counted as not matched), as ``make demo-sql`` does;
* ``all three``: ``agent_match=None``, every agent's calls, the checker's too;
* ``one adapter per agent``: ``adapters={"write": ..., "rewrite": ...}``, a LoRA adapter each for
  the writer and the rewriter over the frozen warm start (the checker is served by the base),
  as ``python -m examples.sql.train --adapters`` does;

and the test split is run again with each side's final weights. Validation (greedy, the val split)
gives the curves. A side is one entry of :data:`SIDES`; ``--sides`` picks some.

Acceptance (medians over the seeds): the warm-started model right on fewer than 30% of the test
questions, and the writer+rewriter side on at least 70% after at most 10 minutes of GRPO wall time
(validation included). The drift counters that mean lost or mismatched tokens
(:attr:`fulgor.adapters.DriftReport.LOSSES`) must be zero at every step of every side. The last line
is ``RESULT ...``. ``--quick`` runs one seed with a few steps of everything on small splits: it
checks the script, not the learning.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _offline import go_offline  # noqa: E402
from examples.sql.train import ADAPTERS, DEFAULT_AGENT_MATCH, SIZES, calls_not_matched, run_demo  # noqa: E402
from examples.sql.warm_start import WarmStartConfig  # noqa: E402
from fulgor.adapters import DriftReport  # noqa: E402
from fulgor.training.run_report import read_metrics  # noqa: E402

# Tokens lost or not the engine's: must be zero. Merge breaks are reported beside them (a sampled
# tokenisation that re-encoding does not give back: the next call starts a new row, and the sampled
# ids are still what is trained).
LOSSES = DriftReport.LOSSES


@dataclass(frozen=True)
class Side:
    """One way of training from the warm start: which agents' calls GRPO trains, and where."""

    label: str
    key: str
    agent_match: str | None
    grpo_name: str
    adapters: tuple[str, ...] = ()


SIDES = (
    Side("writer+rewriter", "selective", DEFAULT_AGENT_MATCH, "grpo"),
    Side("all three", "all", None, "grpo-all"),
    Side("one adapter per agent", "adapters", None, "grpo-adapters", ADAPTERS),
)


def lost_tokens(run_dir: Path) -> dict[str, int]:
    """Each DriftReport.LOSSES counter summed over the run's metrics.jsonl."""
    history = read_metrics(run_dir)
    return {name: sum(int(m.get(f"drift/{name}", 0)) for m in history) for name in LOSSES}


def side_row(run_dir: Path, side: Side, result: Any) -> dict[str, Any]:
    trained = [m for m in result.history if m["step"] > 0]
    history = read_metrics(run_dir / side.grpo_name)
    lost = lost_tokens(run_dir / side.grpo_name)
    return {
        "steps": len(trained),
        "grpo_s": trained[-1]["elapsed_seconds"] if trained else 0.0,
        "after": result.test_after["val_accuracy"],
        "failed": result.test_after["val_rollouts_failed"],
        "lost": sum(lost.values()),
        "lost_detail": lost,
        "merge_breaks": sum(int(m.get("drift/merge_breaks", 0)) for m in history),
        "not_matched": calls_not_matched(result.history),
        "curve": [
            (m["step"], round(m["elapsed_seconds"] if m["step"] else 0.0), m["val_accuracy"])
            for m in result.history
            if "val_accuracy" in m
        ],
    }


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300, help="GRPO steps per side (at most; 9.5 minutes)")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "sql")
    parser.add_argument("--quick", action="store_true", help="one seed, a few steps, small splits")
    parser.add_argument(
        "--sides", nargs="+", choices=[side.key for side in SIDES], default=[side.key for side in SIDES]
    )
    args = parser.parse_args()
    if "selective" not in args.sides:
        parser.error("--sides must include 'selective': the acceptance is measured on it")
    sides = [side for side in SIDES if side.key in args.sides]
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
            warm = WarmStartConfig(seed=seed, format_steps=2, steps=4, batch_size=4)
        started = time.perf_counter()
        row: dict[str, Any] = {"seed": seed}
        for number, side in enumerate(sides):
            result = run_demo(
                run_dir,
                seed=seed,
                warm=warm,
                test_before=number == 0,
                progress=False,
                agent_match=side.agent_match,
                adapters=side.adapters,
                grpo_name=side.grpo_name,
                **options,
            )
            if number == 0:
                row["warm_start_s"] = result.seconds["warm_start"]
                row["before"] = result.test_before["val_accuracy"]
            row[side.key] = side_row(run_dir, side, result)
            print_curve(seed, side, row[side.key])
        row["seconds"] = time.perf_counter() - started
        rows.append(row)

    print(f"\n{time.strftime('%Y-%m-%d')}, {time.perf_counter() - started_all:.0f} s in all")
    header = "| seed | warm start | test acc before |"
    rule = "|---|---|---|"
    for side in sides:
        header += (
            f" {side.label}: GRPO steps | GRPO wall | test acc after | calls not matched | lost tokens |"
        )
        rule += "---|---|---|---|---|"
    print(f"\n{header}\n{rule}")
    for r in rows:
        line = f"| {r['seed']} | {r['warm_start_s']:.0f} s | {r['before']:.1%} |"
        for side in sides:
            s = r[side.key]
            line += (
                f" {s['steps']} | {s['grpo_s']:.0f} s | {s['after']:.1%} | {s['not_matched']} | {s['lost']} |"
            )
        print(line)
    before = statistics.median(r["before"] for r in rows)
    after = {side.key: statistics.median(r[side.key]["after"] for r in rows) for side in sides}
    grpo_s = max(r[side.key]["grpo_s"] for r in rows for side in sides)
    lost = sum(r[side.key]["lost"] for r in rows for side in sides)
    met = before < 0.30 and after["selective"] >= 0.70 and grpo_s <= 600 and lost == 0
    afters = " ".join(f"test_after_{key}={value:.2f}" for key, value in after.items())
    print(
        f"RESULT test_before={before:.2f} {afters} lost_tokens={lost} grpo_seconds_max={grpo_s:.0f} "
        f"seeds={len(rows)} target_met={str(met).lower()}"
    )
    return 0


def print_curve(seed: int, side: Side, row: dict[str, Any]) -> None:
    trained = f"adapters={list(side.adapters)}" if side.adapters else f"agent_match={side.agent_match!r}"
    print(f"  seed {seed}, {side.label} ({trained}): step, GRPO seconds, val accuracy")
    for step, seconds, accuracy in row["curve"]:
        print(f"    {step:>3} {seconds:>5}s  {accuracy:.3f}")
    print(
        f"  test after {row['after']:.3f}; calls not matched {row['not_matched']}; "
        f"lost tokens {row['lost_detail']}; merge breaks {row['merge_breaks']}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
