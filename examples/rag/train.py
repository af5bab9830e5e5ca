"""The RAG demo: a small model built here learns multi-hop retrieval QA with GRPO, on a CPU.

The agent is the unchanged OpenAI Agents SDK agent of :mod:`examples.rag.agent`, searching a
made-up world's passages through an MCP server (stdio) over an SQLite FTS5 index. Stages, each
reusing what an earlier run of the same run directory already made:

1. ``index.sqlite``: the world's passages (:mod:`examples.rag.corpus`) and their BM25 index.
2. ``base``: ``fulgor model init`` builds a ~1M-parameter Llama-style model, its tokenizer fitted
   to the task's words but no name (:func:`examples.rag.warm_start.corpus`).
3. ``warm``: a short SFT on synthetic searches in the agent's exact conversation
   (:mod:`examples.rag.warm_start`): the model knows the tool and the format, but copies names
   badly and mostly stops one search short.
4. ``grpo``: :class:`fulgor.Trainer` runs the agent through the real store, gateway, local engine
   and runner processes, and GRPO learns from the rewards (0.1 x format + 0.9 x answer F1) of its
   own rollouts, for at most 285 s; validation (greedy) before the first step and every few steps,
   with the F1 and the searches per question.
5. The held-out test split (people training never saw), greedy, before GRPO and with the final
   weights; ``grpo/report.html`` and ``grpo/curves.png`` show the curves.

    python -m examples.rag.train                    # a new run under runs/rag-<time>
    python -m examples.rag.train --run-dir runs/rag --seed 1

Ctrl+C at any stage stops every process the demo started and exits with status 130, naming the
``--run-dir`` that continues from the stages it finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any, Final

from examples.calc.train import DemoResult, demo_logging, interrupted
from examples.rag.agent import rag_agent
from examples.rag.corpus import make_splits, make_world
from examples.rag.index import build_index
from examples.rag.warm_start import WarmStartConfig, corpus, warm_start

__all__ = ["DemoResult", "demo_grpo", "run_demo"]

logger = logging.getLogger("examples.rag")

MODEL_NAME = "rag-tiny"
MODEL_SIZE: Final = "tiny"
SIZES = (2000, 64, 128)
"""The train, validation and test splits' sizes."""
MAX_SECONDS = 285.0
"""GRPO's wall-time budget: the last step and its validation end within five minutes."""


def demo_grpo(seed: int = 0, max_steps: int = 300, max_seconds: float | None = MAX_SECONDS) -> Any:
    """The GRPO settings of the demo (a function, so that the benchmark uses the very same).

    Training stops after ``max_steps`` steps or once ``max_seconds`` of wall time are used up,
    whichever comes first.
    """
    from fulgor import GRPO
    from fulgor.algorithms.grpo import GRPOConfig

    return GRPO(
        group_size=8,
        batch_tasks=8,
        max_steps=max_steps,
        max_seconds=max_seconds,
        val_every=10,
        temperature=1.0,
        max_tokens=32,  # the longest query takes about 20 tokens, an answer fewer
        seed=seed,
        config=GRPOConfig(learning_rate=2e-4, micro_batch_size=64),
    )


def run_demo(
    run_dir: Path,
    *,
    seed: int = 0,
    max_steps: int = 300,
    max_seconds: float | None = MAX_SECONDS,
    warm: WarmStartConfig | None = None,
    test_before: bool = False,
    progress: bool = True,
    sizes: tuple[int, int, int] = SIZES,
) -> DemoResult:
    """Build, warm-start, train and test; every stage's output lands under ``run_dir``."""
    from fulgor import Trainer
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.models import init_model
    from fulgor.training.checkpoints import set_torch_threads

    result = DemoResult(run_dir)
    base, warmed, grpo_dir = run_dir / "base", run_dir / "warm", run_dir / "grpo"

    started = time.perf_counter()
    world = make_world(seed)
    index = str(build_index(run_dir / "index.sqlite", world.passages))
    tasks = make_splits(world, seed, sizes)
    splits = {name: [{**task, "index": index} for task in split] for name, split in tasks.items()}
    result.seconds["build_index"] = time.perf_counter() - started

    started = time.perf_counter()
    if not (base / "config.json").is_file():
        logger.info("[1/4] building a %s model and its tokenizer in %s", MODEL_SIZE, base)
        init_model(base, MODEL_SIZE, seed=seed, corpus=corpus())
    result.seconds["build_model"] = time.perf_counter() - started

    started = time.perf_counter()
    if not (warmed / "config.json").is_file():
        logger.info("[2/4] warm start: SFT on synthetic searches (to the end in some of them)")
        set_torch_threads(2)
        warm_start(base, warmed, tasks["train"], index, warm or WarmStartConfig(seed=seed))
    result.seconds["warm_start"] = time.perf_counter() - started

    def trainer(directory: Path = grpo_dir) -> Trainer:
        return Trainer(
            algorithm=demo_grpo(seed, max_steps, max_seconds),
            engine=EngineConfig(model=warmed, served_model_name=MODEL_NAME, device="cpu", seed=seed),
            run_dir=directory,
            n_runners=1,
            max_concurrency=64,
            torch_threads=1,
            progress=progress,
        )

    if test_before:  # in a directory of its own, which never holds a checkpoint: the warm start's weights
        started = time.perf_counter()
        logger.info("held-out test split, greedy, with the warm-started weights")
        result.test_before = trainer(run_dir / "test-before").evaluate(rag_agent, splits["test"])
        result.seconds["test_before"] = time.perf_counter() - started

    started = time.perf_counter()
    logger.info("[3/4] GRPO: at most %d steps through the store, gateway, engine and runners", max_steps)
    result.history = trainer().fit(rag_agent, splits["train"], splits["val"])
    result.seconds["grpo"] = time.perf_counter() - started

    started = time.perf_counter()
    logger.info("[4/4] held-out test split, greedy, with the final weights")
    result.test_after = trainer().evaluate(rag_agent, splits["test"])
    result.seconds["test_after"] = time.perf_counter() - started
    (run_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    from fulgor.training.run_report import read_metrics, text_curve, write_run_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run-dir", type=Path, help="default: runs/rag-<date>-<time>")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300, help="GRPO steps (at most; GRPO stops after 285 s)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    demo_logging()
    run_dir = args.run_dir or Path("runs") / time.strftime("rag-%Y%m%d-%H%M%S")
    started = time.perf_counter()
    try:
        result = run_demo(run_dir, seed=args.seed, max_steps=args.steps, test_before=True)
    except KeyboardInterrupt:
        return interrupted(run_dir)
    grpo_dir = run_dir / "grpo"
    before, after = result.test_before, result.test_after
    report = write_run_report(
        grpo_dir,
        title="rag: GRPO on a tiny model behind an OpenAI Agents SDK agent with an MCP search tool",
        notes={
            "held-out test F1 before GRPO (greedy)": before.get("val_f1"),
            "held-out test F1 after GRPO (greedy)": after.get("val_f1"),
            "held-out searches per question before / after": f"{before.get('val_tool_calls', 0):.2f} / "
            f"{after.get('val_tool_calls', 0):.2f}",
            **{f"seconds: {stage}": round(s, 1) for stage, s in result.seconds.items()},
        },
    )
    print()
    print(text_curve(read_metrics(grpo_dir)))
    print(
        f"\nheld-out test F1 {before.get('val_f1', 0.0):.2f} before GRPO, "
        f"{after.get('val_f1', 0.0):.2f} after "
        f"({before.get('val_tool_calls', 0.0):.2f} and {after.get('val_tool_calls', 0.0):.2f} searches per "
        f"question), {time.perf_counter() - started:.0f}s in all\n"
    )
    for label, path in (
        ("report", report),
        ("curves", grpo_dir / "curves.png"),
        ("metrics per step", grpo_dir / "metrics.jsonl"),
        ("store (rollouts, spans)", grpo_dir / "store.sqlite"),
        ("checkpoints", grpo_dir / "checkpoints"),
        ("runner log", grpo_dir / "logs" / "runners.log"),
        ("search index", run_dir / "index.sqlite"),
        ("models", f"{run_dir / 'base'} (built), {run_dir / 'warm'} (warm start)"),
    ):
        print(f"  {label:<24} {path}")
    print(f"\n  look inside: .venv/bin/fulgor store rollouts --store sqlite:///{grpo_dir / 'store.sqlite'}")
    print(f"  every rollout, model call and token in a browser: .venv/bin/fulgor dashboard {grpo_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
