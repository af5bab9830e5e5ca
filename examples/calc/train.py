"""The calc demo: a small model built here learns to use a calculator tool with GRPO, on a CPU.

Four stages, each reusing what an earlier run of the same run directory already made:

1. ``base``: ``fulgor model init`` builds a ~1M-parameter Llama-style model, its tokenizer fitted
   to the task's texts (:func:`examples.calc.warm_start.corpus`).
2. ``warm``: a short SFT on synthetic solutions that use the calculator only sometimes
   (:mod:`examples.calc.warm_start`): the model knows the tool format, but mostly guesses.
3. ``grpo``: :class:`fulgor.Trainer` runs the unchanged openai-SDK agent (:mod:`examples.calc.agent`)
   through the real store, gateway, local engine and runner processes, and GRPO learns from the
   rewards of its own rollouts; validation (greedy) before the first step and every few steps.
4. The held-out test split, greedy, with the final weights; ``grpo/report.html`` and
   ``grpo/curves.png`` show the curves.

    python -m examples.calc.train                    # a new run under runs/calc-<time>
    python -m examples.calc.train --run-dir runs/calc --seed 1

Ctrl+C at any stage stops every process the demo started and exits with status 130, naming the
``--run-dir`` that continues from the stages it finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from examples.calc.agent import calc_agent
from examples.calc.calculator import CALCULATOR_TOOL
from examples.calc.dataset import make_splits
from examples.calc.warm_start import WarmStartConfig, corpus, warm_start

__all__ = ["DemoAgent", "DemoResult", "demo_grpo", "demo_logging", "interrupted", "main", "run_demo"]

logger = logging.getLogger("examples.calc")

MODEL_NAME = "calc-tiny"


def demo_grpo(seed: int = 0, max_steps: int = 150, max_seconds: float | None = 285.0) -> Any:
    """The GRPO settings of the demo (a function, so that the benchmark uses the very same).

    Training stops after ``max_steps`` steps or once ``max_seconds`` of wall time are used up,
    whichever comes first; the default leaves room for the last step and its validation within
    five minutes.
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
        max_tokens=40,
        seed=seed,
        config=GRPOConfig(learning_rate=2e-4, micro_batch_size=64),
    )


@dataclass(frozen=True)
class DemoAgent:
    """The agent the demo trains: the rollout function, the calculator's definition as it offers
    it to the model (the warm start's conversations carry the same, so that the model learns the
    prompt it will see), and the Python its runner processes run on (None: this one)."""

    agent: Any = calc_agent
    tool: dict[str, Any] = field(default_factory=lambda: CALCULATOR_TOOL)
    runner_python: str | Path | None = None
    label: str = "calc"
    """The run directory's default prefix and the report's title."""


@dataclass
class DemoResult:
    """What a demo run produced, and how long each stage took: wall seconds, and CPU seconds of
    this process and the processes it started and saw end (the runner pool ends with each stage),
    which a busy machine inflates less."""

    run_dir: Path
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    test_before: dict[str, float] = field(default_factory=dict)
    test_warm: dict[str, float] = field(default_factory=dict)
    test_after: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return data

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the stage ``name``: wall and CPU seconds."""
        started, cpu = time.perf_counter(), _cpu_seconds()
        yield
        self.seconds[name] = time.perf_counter() - started
        self.cpu_seconds[name] = _cpu_seconds() - cpu


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_demo(
    run_dir: Path,
    *,
    seed: int = 0,
    max_steps: int = 150,
    warm: WarmStartConfig | None = None,
    test_before: bool = False,
    progress: bool = True,
    sizes: tuple[int, int, int] = (512, 64, 128),
    max_seconds: float | None = 285.0,
    agent: DemoAgent | None = None,
) -> DemoResult:
    """Build, warm-start, train and test; every stage's output lands under ``run_dir``.

    ``sizes`` are the train, validation and test splits' sizes; ``max_seconds`` GRPO's time
    budget; ``agent`` the agent trained (default: the openai-SDK one).
    """
    demo = agent or DemoAgent()
    from fulgor import Trainer
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.models import init_model
    from fulgor.training.checkpoints import set_torch_threads

    result = DemoResult(run_dir)
    splits = make_splits(seed, sizes)
    base, warmed, grpo_dir = run_dir / "base", run_dir / "warm", run_dir / "grpo"

    with result.stage("build_model"):
        if not (base / "config.json").is_file():
            logger.info("[1/4] building a tiny model and its tokenizer in %s", base)
            init_model(base, "tiny", seed=seed, corpus=corpus(splits["train"], demo.tool))

    with result.stage("warm_start"):
        if not (warmed / "config.json").is_file():
            logger.info("[2/4] warm start: SFT on synthetic solutions (the tool in some of them)")
            set_torch_threads(1)  # small matrices: on a busy machine two threads slow each other down
            warm_start(base, warmed, splits["train"], warm or WarmStartConfig(seed=seed), tool=demo.tool)

    def trainer(steps: int) -> Trainer:
        return Trainer(
            algorithm=demo_grpo(seed, steps, max_seconds),
            engine=EngineConfig(model=warmed, served_model_name=MODEL_NAME, device="cpu", seed=seed),
            run_dir=grpo_dir,
            n_runners=1,
            runner_python=demo.runner_python,
            max_concurrency=64,
            torch_threads=1,
            progress=progress,
        )

    if test_before:
        with result.stage("test_before"):
            result.test_before = trainer(max_steps).evaluate(demo.agent, splits["test"])

    with result.stage("grpo"):
        logger.info("[3/4] GRPO: %d steps through the store, gateway, engine and runners", max_steps)
        result.history = trainer(max_steps).fit(demo.agent, splits["train"], splits["val"])

    with result.stage("test_after"):
        logger.info("[4/4] held-out test split, greedy, with the final weights")
        result.test_after = trainer(max_steps).evaluate(demo.agent, splits["test"])
    (run_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def demo_logging() -> None:
    """The demos' console: the time and the message, the servers' request logs quiet."""
    from fulgor.training.reports import QUIET_LOGGERS

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def interrupted(run_dir: Path) -> int:
    """Say, after Ctrl+C, which ``--run-dir`` continues the demo; the exit status 130."""
    print(
        f"\ninterrupted: {run_dir} keeps every stage it finished; to continue, run the demo again "
        f"with --run-dir {run_dir}",
        file=sys.stderr,
    )
    return 130


def main(argv: list[str] | None = None, agent: DemoAgent | None = None) -> int:
    """The demo's command line, for the openai-SDK agent or another (``agent``)."""
    from fulgor.training.run_report import read_metrics, text_curve, write_run_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run-dir", type=Path, help="default: runs/calc-<date>-<time>")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--steps", type=int, default=150, help="GRPO steps (at most; GRPO stops after 5 minutes)"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    demo_logging()
    demo = agent or DemoAgent()
    run_dir = args.run_dir or Path("runs") / time.strftime(f"{demo.label}-%Y%m%d-%H%M%S")
    started = time.perf_counter()
    try:
        result = run_demo(run_dir, seed=args.seed, max_steps=args.steps, agent=demo)
    except KeyboardInterrupt:
        return interrupted(run_dir)
    grpo_dir = run_dir / "grpo"
    first = next((m for m in result.history if m.get("step") == 0), {})
    report = write_run_report(
        grpo_dir,
        title=f"{demo.label}: GRPO on a tiny model with a calculator tool",
        notes={
            "validation accuracy before GRPO": first.get("val_accuracy"),
            "held-out test accuracy after GRPO (greedy)": result.test_after.get("val_accuracy"),
            "held-out tool-call rate after GRPO": result.test_after.get("val_tool_call_rate"),
            **{f"seconds: {stage}": round(s, 1) for stage, s in result.seconds.items()},
        },
    )
    print()
    print(text_curve(read_metrics(grpo_dir)))
    accuracy = result.test_after.get("val_accuracy", 0.0)
    tools = result.test_after.get("val_tool_call_rate", 0.0)
    print(f"\nheld-out test accuracy {accuracy:.1%} (tool-call rate {tools:.1%}), ", end="")
    print(f"{time.perf_counter() - started:.0f}s in all\n")
    for label, path in (
        ("report", report),
        ("curves", grpo_dir / "curves.png"),
        ("metrics per step", grpo_dir / "metrics.jsonl"),
        ("store (rollouts, spans)", grpo_dir / "store.sqlite"),
        ("checkpoints", grpo_dir / "checkpoints"),
        ("runner log", grpo_dir / "logs" / "runners.log"),
        ("models", f"{run_dir / 'base'} (built), {run_dir / 'warm'} (warm start)"),
    ):
        print(f"  {label:<24} {path}")
    print(f"\n  look inside: .venv/bin/fulgor store rollouts --store sqlite:///{grpo_dir / 'store.sqlite'}")
    print(f"  every rollout, model call and token in a browser: .venv/bin/fulgor dashboard {grpo_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
