"""The crew learns: a tiny model built here, warm-started, then trained with GRPO through the crew.

The crew is the unchanged CrewAI crew of :mod:`examples.crew.agent`, and all of it runs on a CPU.

Three stages, each reusing what an earlier run of the same run directory already made:

1. ``base``: ``fulgor model init`` builds a ~1M-parameter model, its tokenizer fitted to the crew's
   texts (:func:`examples.crew.warm_start.corpus`).
2. ``warm``: a short SFT on synthetic crew runs whose solver uses the calculator only sometimes
   (:mod:`examples.crew.warm_start`): the model knows both agents' formats, but mostly guesses.
3. ``grpo``: :class:`fulgor.Trainer` runs the crew (:func:`examples.crew.agent.calc_crew`, in
   runner processes on the CrewAI environment's Python, which import CrewAI once) through the real
   store, gateway and local engine, and GRPO trains both agents' calls on the rewards: steps of 64
   rollouts, stopping once ``max_seconds`` are used; validation (greedy, held-out problems) before
   the first step, every ``val_every`` steps and after the last.

    python -m examples.crew.train --run-dir runs/crew
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from examples.calc.dataset import make_splits
from examples.calc.train import DemoResult
from examples.crew.agent import calc_crew, crewai_python
from examples.crew.warm_start import WarmStartConfig, corpus, warm_start

__all__ = ["SIZES", "crew_grpo", "run_crew"]

logger = logging.getLogger("examples.crew")

MODEL_NAME = "crew-tiny"
# Train, validation (held out, greedy) and unused test problems.
SIZES = (512, 64, 0)


def crew_grpo(
    seed: int = 0, max_steps: int = 150, max_seconds: float | None = 285.0, val_every: int = 10
) -> Any:
    """The GRPO settings of the crew's run: the calc demo's (steps of 64 rollouts, 8 problems x 8,
    at most ``max_seconds`` of wall time, validation included)."""
    from fulgor import GRPO
    from fulgor.algorithms.grpo import GRPOConfig

    return GRPO(
        group_size=8,
        batch_tasks=8,
        max_steps=max_steps,
        max_seconds=max_seconds,
        val_every=val_every,
        temperature=1.0,
        max_tokens=40,
        seed=seed,
        config=GRPOConfig(learning_rate=5e-4, micro_batch_size=64),
    )


def run_crew(
    run_dir: Path,
    *,
    seed: int = 0,
    max_steps: int = 150,
    max_seconds: float | None = 285.0,
    val_every: int = 10,
    warm: WarmStartConfig | None = None,
    progress: bool = True,
    sizes: tuple[int, int, int] = SIZES,
) -> DemoResult:
    """Build, warm-start and train; every stage's output lands under ``run_dir``. The result's
    ``history`` holds each step's metrics (``reward_mean``, and ``val_accuracy`` where validated)."""
    from fulgor import Trainer
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.models import init_model
    from fulgor.training.checkpoints import set_torch_threads

    result = DemoResult(run_dir)
    splits = make_splits(seed, sizes)
    base, warmed = run_dir / "base", run_dir / "warm"
    started = time.perf_counter()
    if not (base / "config.json").is_file():
        logger.info("[1/3] building a tiny model and its tokenizer in %s", base)
        init_model(base, "tiny", seed=seed, corpus=corpus(splits["train"]))
    result.seconds["build_model"] = time.perf_counter() - started

    started = time.perf_counter()
    if not (warmed / "config.json").is_file():
        logger.info("[2/3] warm start: SFT on synthetic crew runs (the tool in some of them)")
        set_torch_threads(1)
        warm_start(base, warmed, splits["train"], warm or WarmStartConfig(seed=seed))
    result.seconds["warm_start"] = time.perf_counter() - started

    started = time.perf_counter()
    logger.info("[3/3] GRPO through the crew, store, gateway, engine and runners")
    trainer = Trainer(
        algorithm=crew_grpo(seed, max_steps, max_seconds, val_every),
        engine=EngineConfig(model=warmed, served_model_name=MODEL_NAME, device="cpu", seed=seed),
        run_dir=run_dir / "grpo",
        n_runners=1,
        runner_python=crewai_python(),
        max_concurrency=16,
        torch_threads=1,
        progress=progress,
    )
    result.history = trainer.fit(calc_crew, splits["train"], splits["val"])
    result.seconds["grpo"] = time.perf_counter() - started
    (run_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run-dir", type=Path, help="default: runs/crew-<date>-<time>")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150, help="GRPO steps at most")
    parser.add_argument("--seconds", type=float, default=285.0, help="GRPO's wall-time budget")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    run_dir = args.run_dir or Path("runs") / time.strftime("crew-%Y%m%d-%H%M%S")
    result = run_crew(run_dir, seed=args.seed, max_steps=args.steps, max_seconds=args.seconds)
    for metrics in result.history:
        validated = (
            f"  validation accuracy {metrics['val_accuracy']:.1%}" if "val_accuracy" in metrics else ""
        )
        print(f"step {metrics['step']:>3}  reward {metrics.get('reward_mean', float('nan')):.3f}{validated}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
