"""The SQL demo: a small model built here learns to answer questions in SQL with GRPO, on a CPU.

The agent is the unchanged LangGraph graph of :mod:`examples.sql.agent`: a writer, a checker and a
rewriter, each model call named by its node. Stages, each reusing what an earlier run of the same
run directory already made:

1. ``company.sqlite``: the seeded company database the questions ask about.
2. ``base``: ``fulgor model init`` builds a ~1M-parameter Llama-style model, its tokenizer fitted
   to the task's texts (:func:`examples.sql.warm_start.corpus`).
3. ``warm``: a short SFT on synthetic solutions in the three agents' conversations
   (:mod:`examples.sql.warm_start`): the model knows the formats, but its queries mostly make
   their template's one systematic mistake.
4. ``grpo``: :class:`fulgor.Trainer` runs the graph through the real store, gateway, local engine
   and runner processes, and GRPO learns from the rewards (execution accuracy) of its own rollouts,
   on the calls of the agents ``agent_match`` picks (by default the writer's and the rewriter's;
   the checker's calls are counted as not matched); validation (greedy) before the first step and
   every few steps.
5. The held-out test split, greedy, before GRPO and with the final weights; ``grpo/report.html``
   and ``grpo/curves.png`` show the curves.

    python -m examples.sql.train                           # a new run under runs/sql-<time>
    python -m examples.sql.train --run-dir runs/sql --seed 1 --agent-match all
    python -m examples.sql.train --adapters                # a LoRA adapter each for writer, rewriter

Ctrl+C at any stage stops every process the demo started and exits with status 130, naming the
``--run-dir`` that continues from the stages it finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from examples.calc.train import demo_logging, interrupted
from examples.sql.agent import sql_agent
from examples.sql.database import build_database
from examples.sql.dataset import make_splits
from examples.sql.warm_start import WarmStartConfig, corpus, warm_start

__all__ = ["ADAPTERS", "DEFAULT_AGENT_MATCH", "DemoResult", "demo_grpo", "run_demo"]

logger = logging.getLogger("examples.sql")

MODEL_NAME = "sql-tiny"
MODEL_SIZE: Final = "tiny"
DEFAULT_AGENT_MATCH = "write|rewrite"
"""The writer's and the rewriter's calls are trained; the checker's are not."""
SIZES = (400, 64, 128)
"""The train, validation and test splits' sizes."""
MAX_SECONDS = 570.0
"""GRPO's wall-time budget: the last step and its validation end within ten minutes."""
ADAPTERS: Final = ("write", "rewrite")
"""With ``--adapters``: one LoRA adapter each for the writer and the rewriter (names are agent-name
prefixes); the checker is served by the frozen base."""
LEARNING_RATE = 2e-4
ADAPTER_LEARNING_RATE = 2e-3
"""A LoRA adapter trains far fewer weights from zero; it takes a larger step."""


def demo_grpo(
    seed: int = 0,
    max_steps: int = 300,
    max_seconds: float | None = MAX_SECONDS,
    agent_match: str | None = DEFAULT_AGENT_MATCH,
    adapters: tuple[str, ...] = (),
) -> Any:
    """The GRPO settings of the demo (a function, so that the benchmark uses the very same).

    Training stops after ``max_steps`` steps or once ``max_seconds`` of wall time are used up,
    whichever comes first. ``agent_match`` picks the agents whose calls are trained (None: all);
    ``adapters`` instead names agents that each train a LoRA adapter of their own over the frozen
    base (``agent_match`` must then be None: the adapters pick the calls).
    """
    from fulgor import GRPO
    from fulgor.algorithms.grpo.config import GRPOConfig
    from fulgor.weights.lora import LoraConfig

    return GRPO(
        group_size=8,
        batch_tasks=8,
        max_steps=max_steps,
        max_seconds=max_seconds,
        val_every=10,
        temperature=1.0,
        max_tokens=48,  # the longest gold query takes 45 tokens, its end-of-turn one more
        agent_match=agent_match,
        adapters={name: LoraConfig(rank=8) for name in adapters} or None,
        seed=seed,
        config=GRPOConfig(
            learning_rate=ADAPTER_LEARNING_RATE if adapters else LEARNING_RATE, micro_batch_size=64
        ),
    )


@dataclass
class DemoResult:
    """What a demo run produced, and how long each stage took."""

    run_dir: Path
    agent_match: str | None = DEFAULT_AGENT_MATCH
    adapters: tuple[str, ...] = ()
    seconds: dict[str, float] = field(default_factory=dict)
    test_before: dict[str, float] = field(default_factory=dict)
    test_after: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return data


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
    agent_match: str | None = DEFAULT_AGENT_MATCH,
    adapters: tuple[str, ...] = (),
    grpo_name: str = "grpo",
) -> DemoResult:
    """Build, warm-start, train and test; every stage's output lands under ``run_dir``.

    GRPO's own output goes to ``run_dir / grpo_name``, so that runs with another ``agent_match``
    can start from the same warm start side by side; ``result.json`` is written beside it
    (``result.json`` for ``grpo``, ``result-<grpo_name>.json`` otherwise).
    """
    from fulgor import Trainer
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.models import init_model
    from fulgor.training.checkpoints import set_torch_threads

    result = DemoResult(run_dir, agent_match, adapters)
    base, warmed, grpo_dir = run_dir / "base", run_dir / "warm", run_dir / grpo_name

    started = time.perf_counter()
    database = str(build_database(run_dir / "company.sqlite"))
    splits = {
        name: [{**task, "database": database} for task in tasks]
        for name, tasks in make_splits(seed, sizes).items()
    }
    result.seconds["build_database"] = time.perf_counter() - started

    started = time.perf_counter()
    if not (base / "config.json").is_file():
        logger.info("[1/4] building a %s model and its tokenizer in %s", MODEL_SIZE, base)
        init_model(base, MODEL_SIZE, seed=seed, corpus=corpus(splits["train"]))
    result.seconds["build_model"] = time.perf_counter() - started

    started = time.perf_counter()
    if not (warmed / "config.json").is_file():
        logger.info("[2/4] warm start: SFT on synthetic solutions (the gold query in some of them)")
        set_torch_threads(1)  # small matrices: on a busy machine two threads slow each other down
        warm_start(base, warmed, splits["train"], warm or WarmStartConfig(seed=seed))
    result.seconds["warm_start"] = time.perf_counter() - started

    def trainer(directory: Path = grpo_dir) -> Trainer:
        return Trainer(
            algorithm=demo_grpo(seed, max_steps, max_seconds, agent_match, adapters),
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
        result.test_before = trainer(run_dir / "test-before").evaluate(sql_agent, splits["test"])
        result.seconds["test_before"] = time.perf_counter() - started

    started = time.perf_counter()
    if adapters:
        trained = f"{', '.join(adapters)}, one LoRA adapter each over the frozen base"
    else:
        trained = "all agents" if agent_match is None else f"the agents matching {agent_match!r}"
    logger.info("[3/4] GRPO: at most %d steps, on the calls of %s", max_steps, trained)
    result.history = trainer().fit(sql_agent, splits["train"], splits["val"])
    result.seconds["grpo"] = time.perf_counter() - started

    started = time.perf_counter()
    logger.info("[4/4] held-out test split, greedy, with the final weights")
    result.test_after = trainer().evaluate(sql_agent, splits["test"])
    result.seconds["test_after"] = time.perf_counter() - started
    name = "result.json" if grpo_name == "grpo" else f"result-{grpo_name}.json"
    (run_dir / name).write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def calls_not_matched(history: list[dict[str, Any]]) -> int:
    """The training steps' model calls of agents ``agent_match`` left out (validation's aside)."""
    return sum(int(m.get("drift/calls_not_matched", 0)) for m in history if m.get("step", 0) > 0)


def main(argv: list[str] | None = None) -> int:
    from fulgor.training.run_report import read_metrics, text_curve, write_run_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run-dir", type=Path, help="default: runs/sql-<date>-<time>")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--steps", type=int, default=300, help="GRPO steps (at most; GRPO stops after 9.5 minutes)"
    )
    parser.add_argument(
        "--agent-match",
        default=DEFAULT_AGENT_MATCH,
        help="a regular expression naming the agents whose calls train (write_query, check_query, "
        f"rewrite_query), or 'all' (default: {DEFAULT_AGENT_MATCH!r})",
    )
    parser.add_argument(
        "--adapters",
        action="store_true",
        help="one LoRA adapter each for the writer and the rewriter over the frozen base, instead of "
        "training the whole model on the calls --agent-match picks",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.adapters and args.agent_match != DEFAULT_AGENT_MATCH:
        parser.error("--adapters picks the calls that train (writer, rewriter): drop --agent-match")
    agent_match = None if args.agent_match == "all" or args.adapters else args.agent_match
    adapters = ADAPTERS if args.adapters else ()
    trained = f"one adapter each: {', '.join(adapters)}" if adapters else args.agent_match
    demo_logging()
    run_dir = args.run_dir or Path("runs") / time.strftime("sql-%Y%m%d-%H%M%S")
    started = time.perf_counter()
    try:
        result = run_demo(
            run_dir,
            seed=args.seed,
            max_steps=args.steps,
            test_before=True,
            agent_match=agent_match,
            adapters=adapters,
        )
    except KeyboardInterrupt:
        return interrupted(run_dir)
    grpo_dir = run_dir / "grpo"
    first = next((m for m in result.history if m.get("step") == 0), {})
    before = result.test_before.get("val_accuracy", 0.0)
    after = result.test_after.get("val_accuracy", 0.0)
    report = write_run_report(
        grpo_dir,
        title=f"sql: GRPO on a tiny model behind a LangGraph writer, checker and rewriter "
        f"(trained: {trained})",
        notes={
            "agents trained": trained,
            "validation accuracy before GRPO": first.get("val_accuracy"),
            "held-out test accuracy before GRPO (greedy)": before,
            "held-out test accuracy after GRPO (greedy)": after,
            "model calls not matched (not trained)": calls_not_matched(result.history),
            **{f"seconds: {stage}": round(s, 1) for stage, s in result.seconds.items()},
        },
    )
    print()
    print(text_curve(read_metrics(grpo_dir)))
    print(f"\nheld-out test accuracy {before:.1%} before GRPO, {after:.1%} after, ", end="")
    print(f"{time.perf_counter() - started:.0f}s in all\n")
    for label, path in (
        ("report", report),
        ("curves", grpo_dir / "curves.png"),
        ("metrics per step", grpo_dir / "metrics.jsonl"),
        ("store (rollouts, spans)", grpo_dir / "store.sqlite"),
        ("checkpoints", grpo_dir / "checkpoints"),
        ("runner log", grpo_dir / "logs" / "runners.log"),
        ("database", run_dir / "company.sqlite"),
        ("models", f"{run_dir / 'base'} (built), {run_dir / 'warm'} (warm start)"),
    ):
        print(f"  {label:<24} {path}")
    print(f"\n  look inside: .venv/bin/fulgor store rollouts --store sqlite:///{grpo_dir / 'store.sqlite'}")
    print(f"  every rollout, model call and token in a browser: .venv/bin/fulgor dashboard {grpo_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
