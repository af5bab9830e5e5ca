"""SFT on the calc task: GRPO, rejection sampling and distillation side by side; the SFT step against TRL.

Usage::

    .venv/bin/python benchmarks/sft.py [--parts learning throughput] [--seeds 0 1 2] [--seconds 285]

**learning** (the default part, with ``throughput``):

For each seed, in ``.bench/sft/seed-N`` (made afresh), with the same warm-started model and the same
wall-time budget as ``benchmarks/learning.py`` (``--seconds`` of training, validation included):

1. **GRPO**: the calc demo's own run (:func:`examples.calc.train.run_demo`), then the held-out test
   split, greedy.
2. **Rejection-sampling SFT**: :class:`fulgor.SFT` from the warm start, 8 rollouts of each of 8 tasks
   per step, learning those with reward 1 (``min_reward=1.0``), on exactly the tokens the engine
   sampled; then the test split.
3. **Distillation**: the GRPO-trained model is the teacher: the calc agent runs once on every
   training task through the gateway to it (sampling at temperature 1), and a fresh copy of the warm
   start learns the recorded rollouts with reward 1 (``SFT(from_run=..., min_reward=1.0)``),
   rendered with its own chat template; then the test split.

**throughput**: trained tokens/s of fulgor's SFT step (``SFTUpdater.step``, what each SFT step of
the Trainer runs) against TRL's ``SFTTrainer`` (``benchmarks/_trl_sft_step.py``, installed into
``.bench/trl-<version>`` as ``benchmarks/grpo_step.py`` installs it), on the same locally built model
(``tiny`` and ``small``), the same rows and the same torch thread count: 64 calc conversations
(the warm start's synthetic solutions, half of them with a calculator call) rendered with the
model's chat template, the assistant turns under the loss; one optimiser step per pass over the
rows in micro-batches of 16, AdamW at the same learning rate, gradients clipped at 1.0, float32,
SDPA attention, no gradient checkpointing. Each side loads the model afresh per repetition, runs a
warm-up step, then times ``--steps`` steps; the sides alternate. Target: fulgor >= 1.5x TRL's
trained tokens/s (median step, wall clock) at every size.

It prints a table per part and ends with ``RESULT ...``. Timings are this machine's; ratios and
accuracies are what to compare.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _offline import go_offline  # noqa: E402
from examples.calc.agent import calc_agent  # noqa: E402
from examples.calc.dataset import make_splits  # noqa: E402
from examples.calc.train import MODEL_NAME, demo_grpo, run_demo  # noqa: E402
from examples.calc.warm_start import corpus  # noqa: E402

SFT_LEARNING_RATE = 2e-4  # GRPO's in the demo; the warm start trained at 2e-3
THROUGHPUT_ROWS = 64
MICRO_BATCH = 16
TARGET_SPEEDUP = 1.5


def trainer(algorithm: Any, model: Path, run_dir: Path, seed: int) -> Any:
    from fulgor import Trainer
    from fulgor.engine.local import EngineConfig

    return Trainer(
        algorithm=algorithm,
        engine=EngineConfig(model=model, served_model_name=MODEL_NAME, device="cpu", seed=seed),
        run_dir=run_dir,
        n_runners=1,
        max_concurrency=64,
        torch_threads=1,
        progress=False,
    )


def sft(seed: int, seconds: float, **source: Any) -> Any:
    from fulgor import SFT
    from fulgor.algorithms.sft import SFTConfig

    return SFT(
        **source,
        min_reward=1.0,
        group_size=8,
        batch_tasks=8,
        max_steps=1000,
        max_seconds=seconds,
        val_every=10,
        max_tokens=40,
        seed=seed,
        config=SFTConfig(learning_rate=SFT_LEARNING_RATE, micro_batch_size=64),
    )


def newest_weights(run_dir: Path) -> Path:
    from fulgor.training.checkpoints import latest_checkpoint

    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        raise RuntimeError(f"{run_dir} holds no checkpoint")
    return latest[1]


def run_seed(out: Path, seed: int, seconds: float) -> dict[str, Any]:
    splits = make_splits(seed)
    work = out / f"seed-{seed}"
    shutil.rmtree(work, ignore_errors=True)
    print(f"seed {seed}: {work}", flush=True)
    row: dict[str, Any] = {"seed": seed}

    started = time.perf_counter()
    demo = run_demo(work, seed=seed, max_steps=1000, progress=False)
    row["grpo"] = demo.test_after["val_accuracy"]
    row["grpo_steps"] = max(m["step"] for m in demo.history)
    row["grpo_s"] = demo.seconds["grpo"]
    warm = work / "warm"

    started = time.perf_counter()
    rs_dir = work / "rs-sft"
    history = trainer(sft(seed, seconds), warm, rs_dir, seed).fit(calc_agent, splits["train"], splits["val"])
    row["rs_s"] = time.perf_counter() - started
    row["rs_steps"] = max(m["step"] for m in history)
    row["rs_selected"] = sum(m.get("rollouts_selected", 0) for m in history)
    row["rs"] = trainer(sft(seed, seconds), warm, rs_dir, seed).evaluate(calc_agent, splits["test"])[
        "val_accuracy"
    ]

    started = time.perf_counter()
    teacher_dir = work / "teacher"
    teacher = newest_weights(work / "grpo")
    report = trainer(demo_grpo(seed), teacher, teacher_dir, seed).dev(calc_agent, splits["train"])
    row["teacher_s"] = time.perf_counter() - started
    row["teacher_correct"] = sum(1 for r in report.rollouts if r.reward == 1.0)

    started = time.perf_counter()
    distill_dir = work / "distill"
    distill = sft(seed, seconds, from_run=teacher_dir, batch_size=64)
    history = trainer(distill, warm, distill_dir, seed).fit(calc_agent, splits["train"], splits["val"])
    row["distill_s"] = time.perf_counter() - started
    row["distill_steps"] = max(m["step"] for m in history)
    row["distill"] = trainer(distill, warm, distill_dir, seed).evaluate(calc_agent, splits["test"])[
        "val_accuracy"
    ]
    row["warm"] = next(m["val_accuracy"] for m in demo.history if m["step"] == 0)
    return row


# -- throughput -----------------------------------------------------------------------------------


def calc_rows(model_dir: Path) -> list[Any]:
    """The warm start's synthetic solutions of 64 training problems, rendered for ``model_dir``."""
    from examples.calc.agent import CALCULATOR_TOOL
    from examples.calc.warm_start import solution
    from fulgor.adapters.transcripts import Transcript
    from fulgor.algorithms.sft.distill import teacher_data
    from fulgor.weights.loading import eos_token_ids
    from fulgor.weights.policy import load_policy

    policy = load_policy(model_dir, "cpu")
    tasks = make_splits(0)["train"][:THROUGHPUT_ROWS]
    transcripts = [Transcript.of(solution(t, i % 2 == 0), [CALCULATOR_TOOL]) for i, t in enumerate(tasks)]
    stops = eos_token_ids(policy.model, policy.tokenizer)
    data = teacher_data(transcripts, policy.tokenizer, stop_token_ids=stops)
    if data.unusable:
        raise RuntimeError(f"the solutions do not render: {data.summary()}")
    return [trajectory.rows[0] for trajectory in data.trajectories]


def time_fulgor(model_dir: Path, rows: list[Any], threads: int, warmup: int, steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from fulgor.algorithms.sft import SFTConfig, SFTUpdater

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    updater = SFTUpdater(
        model, SFTConfig(learning_rate=1e-4, micro_batch_size=MICRO_BATCH, max_grad_norm=1.0)
    )
    seconds, cpu_seconds, tokens = [], [], []
    for step in range(warmup + steps):
        wall, cpu = time.perf_counter(), time.process_time()
        metrics = updater.step_rows(rows)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if step >= warmup:
            seconds.append(wall)
            cpu_seconds.append(cpu)
            tokens.append(int(metrics["trained_tokens"]))
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "trained_tokens": tokens}


def time_trl(
    python: Path, model_dir: Path, rows: list[Any], threads: int, warmup: int, steps: int, work: Path
) -> dict[str, Any]:
    from grpo_step import TRL_VERSION, _trl_env

    spec = work / "trl-sft-spec.json"
    spec.write_text(
        json.dumps(
            {
                "model_dir": str(model_dir),
                "attn_implementation": "sdpa",
                "output_dir": str(work / "trl-out"),
                "threads": threads,
                "micro_batch_size": MICRO_BATCH,
                "learning_rate": 1e-4,
                "max_grad_norm": 1.0,
                "warmup_steps": warmup,
                "steps": steps,
                "rows": [{"token_ids": r.token_ids, "loss_mask": r.loss_mask} for r in rows],
            }
        )
    )
    script = Path(__file__).resolve().parent / "_trl_sft_step.py"
    done = subprocess.run(
        [str(python), str(script), str(spec)],
        capture_output=True, text=True, env=_trl_env(threads), cwd=work, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"TRL {TRL_VERSION} SFT run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(
        [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    )
    if result["threads"] != [threads] or result["checkpointing"] or result["attn_implementation"] != "sdpa":
        raise RuntimeError(f"TRL did not run as specified: {result}")
    return result


def throughput(args: argparse.Namespace) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fulgor.engine.models import init_model
    from grpo_step import TRL_VERSION, ensure_trl

    python = ensure_trl()
    work = args.out / "throughput"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fields: dict[str, float] = {}
    print(
        f"\nSFT step, trained tokens/s (median step), fulgor vs TRL {TRL_VERSION} SFTTrainer, "
        f"{args.threads} thread(s)"
    )
    print(
        f"{'size':>6} {'rows':>5} {'tokens':>7} {'fulgor tok/s':>13} {'TRL tok/s':>10} {'ratio':>6} "
        f"{'ratio (CPU)':>11}"
    )
    for size in args.sizes:
        model_dir = init_model(work / size, size, seed=0, corpus=corpus(make_splits(0)["train"]))
        rows = calc_rows(model_dir)
        sides: dict[str, dict[str, list[float]]] = {"fulgor": {}, "trl": {}}
        for repeat in range(args.repeats):
            order = ("fulgor", "trl") if repeat % 2 == 0 else ("trl", "fulgor")
            for side in order:
                if side == "fulgor":
                    got = time_fulgor(model_dir, rows, args.threads, 1, args.steps)
                else:
                    got = time_trl(python, model_dir, rows, args.threads, 1, args.steps, work)
                for key, values in got.items():
                    if isinstance(values, list):
                        sides[side].setdefault(key, []).extend(values)
        tokens = {side: set(sides[side]["trained_tokens"]) for side in sides}
        if len(tokens["fulgor"]) != 1 or tokens["fulgor"] != tokens["trl"]:
            raise RuntimeError(f"the sides trained different token counts: {tokens}")
        [count] = tokens["fulgor"]
        rate = {side: count / statistics.median(sides[side]["seconds"]) for side in sides}
        cpu = {side: count / statistics.median(sides[side]["cpu_seconds"]) for side in sides}
        ratio, cpu_ratio = rate["fulgor"] / rate["trl"], cpu["fulgor"] / cpu["trl"]
        print(
            f"{size:>6} {len(rows):>5} {count:>7} {rate['fulgor']:>13,.0f} {rate['trl']:>10,.0f} "
            f"{ratio:>5.2f}x {cpu_ratio:>10.2f}x"
        )
        fields.update(
            {
                f"{size}_fulgor_tokens_per_s": rate["fulgor"],
                f"{size}_trl_tokens_per_s": rate["trl"],
                f"{size}_fulgor_vs_trl": ratio,
                f"{size}_fulgor_vs_trl_cpu": cpu_ratio,
            }
        )
    return fields


def learning(args: argparse.Namespace) -> dict[str, float]:
    rows = [run_seed(args.out, seed, args.seconds) for seed in args.seeds]
    header = (
        f"{'seed':>4} {'warm val':>8} {'GRPO test':>9} {'steps':>5} {'RS-SFT test':>11} {'steps':>5} "
        f"{'teacher ok':>10} {'distil test':>11} {'steps':>5}"
    )
    print(header)
    for row in rows:
        print(
            f"{row['seed']:>4} {row['warm']:>8.1%} {row['grpo']:>9.1%} {row['grpo_steps']:>5} "
            f"{row['rs']:>11.1%} {row['rs_steps']:>5} {row['teacher_correct']:>10} "
            f"{row['distill']:>11.1%} {row['distill_steps']:>5}"
        )
    medians = {name: statistics.median(row[name] for row in rows) for name in ("grpo", "rs", "distill")}
    print(
        f"median: GRPO {medians['grpo']:.1%}, rejection-sampling SFT {medians['rs']:.1%}, "
        f"distillation {medians['distill']:.1%} (held-out test, greedy)"
    )
    (args.out / "learning.json").write_text(json.dumps(rows, indent=2) + "\n")
    return {
        "seeds": len(rows),
        "grpo_median": medians["grpo"],
        "rs_sft_median": medians["rs"],
        "distill_median": medians["distill"],
    }


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--parts", nargs="+", choices=("learning", "throughput"), default=["learning", "throughput"]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=285.0, help="training wall time of each method")
    parser.add_argument(
        "--sizes", nargs="+", default=["tiny", "small"], help="model sizes for the throughput part"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per repetition (throughput)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "sft")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    fields: dict[str, float] = {}
    if "learning" in args.parts:
        fields.update(learning(args))
    if "throughput" in args.parts:
        fields.update(throughput(args))
        ratios = [value for key, value in fields.items() if key.endswith("_fulgor_vs_trl")]
        fields["target_met"] = float(all(ratio >= TARGET_SPEEDUP for ratio in ratios))
    print("RESULT " + " ".join(f"{key}={_shown(key, value)}" for key, value in fields.items()))
    return 0


def _shown(key: str, value: float) -> str:
    if key == "target_met":
        return str(bool(value)).lower()
    if key == "seeds":
        return str(int(value))
    return f"{value:.3f}" if value < 100 else f"{value:.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
