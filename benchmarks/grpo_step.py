"""GRPO update throughput: trained tokens/s of fulgor's ``PolicyUpdater.step`` against TRL's ``GRPOTrainer``.

Usage::

    .venv/bin/python benchmarks/grpo_step.py [--sizes tiny small] [--repeats 3] [--steps 3] [--threads 1]
    .venv/bin/python benchmarks/grpo_step.py --parts reward [--budget-s 120] [--test-problems 128]

Both sides train the same locally built Llama (``init_model``, saved in Hugging Face format, loaded
by each side in float32 with SDPA attention) on the same batch: ``--groups`` prompts x
``--group-size`` completions; each prompt ``--min-prompt-tokens`` to ``--max-prompt-tokens`` tokens,
each completion ``--min-completion-tokens`` to ``--max-completion-tokens`` tokens ending in EOS
(lengths and ids drawn once, seeded), a reward and sampled logprobs per completion. Both take one
optimiser step per batch in micro-batches of ``--micro-batch`` sequences (gradient accumulation over
the rest), with ``torch.optim.AdamW`` (the same learning rate, no weight decay, no schedule),
gradient-norm clipping at 1.0, clip range 0.2, no KL term, group-normalised advantages, the loss
averaged over each sequence's tokens and then over sequences (TRL's ``loss_type="grpo"``), float32,
no gradient checkpointing (TRL's default turns it on; it is turned off here), on CPU with the same
torch thread count (checked on both sides during the steps). Trained tokens are the completion
tokens, the tokens under the loss: the same count on both sides, checked against what each side
reports.

What is timed:

* fulgor: the whole ``PolicyUpdater.step(trajectories)`` call: advantages, collating the
  trajectories into tensors, then per micro-batch forward, loss and backward, then clipping and the
  optimiser step. The trajectories (one row per completion, the prompt under loss mask 0) are built
  beforehand, as the adapter hands them over in training.
* TRL (``benchmarks/_trl_grpo_step.py``, run in ``.bench/trl-<version>`` as a subprocess): one
  optimiser step of ``GRPOTrainer.train()`` from the ``on_step_begin`` callback to ``on_step_end``:
  ``training_step`` per micro-batch (``compute_loss`` with TRL's fused LM head, backward), clipping,
  ``optimizer.step()``, the scheduler step and ``zero_grad``, minus the time spent inside
  ``_generate_and_score_completions``. The completions come from TRL's ``rollout_func`` hook (it
  returns the pre-generated ids) and the rewards from a reward function that returns the pre-set
  values, so nothing is generated. Putting aside the whole of ``_generate_and_score_completions``
  also drops TRL's decoding, advantage computation and padding, work that fulgor's timed step still
  does (collating and advantages): a small bias in TRL's favour (the time put aside is printed).

So both figures cover the same thing: from scored completions in memory to updated weights. The two
implementations differ in ways that are theirs to own, and that the numbers include: TRL's fused LM
head computes log-probabilities only at completion positions, in tiles (recomputed in backward),
while fulgor runs its LM head once, at completion positions only too; TRL left-pads prompts and
right-pads completions (rows as wide as the longest prompt plus the longest completion) while fulgor
right-pads whole rows, sorts them by length and cuts each micro-batch to its own longest row (the
table prints the widest on each side); fulgor also applies its importance correction from the
sampled logprobs.

Each repetition loads the model afresh on each side, runs ``--warmup`` untimed steps, then times
``--steps`` steps; the sides alternate per repetition so that other load on the machine falls on
both. The median step time over all repetitions gives trained tokens/s, from wall-clock time (the
headline) and from the CPU time of each side's process (less sensitive to other work on a shared
machine). The last line is machine-readable::

    RESULT tiny_fulgor_tokens_per_s=<x> tiny_trl_tokens_per_s=<x> tiny_fulgor_vs_trl=<x>
        tiny_fulgor_vs_trl_cpu=<x> small_... target_met=<bool>

Target: fulgor >= 1.5x TRL's trained tokens/s (wall clock) for every size. TRL is installed on first
use into its own virtual environment, torch first and pinned to ``torch==2.13.0`` (a CPU wheel where
one is available) in every install call, with the ``transformers`` release of this environment so
that both sides run the same model code.

``--parts`` picks what runs: ``throughput`` (the default, above), ``reward``, or both. The reward part
(``benchmarks/_grpo_reward.py``, with ``benchmarks/_trl_grpo_reward.py`` for TRL's side) measures the
reward after equal wall time on the single-turn calc task: both sides start from the same
warm-started tiny model and train with the calc demo's GRPO settings on the same prompts in the same
order, fulgor through the whole system (``Trainer.fit``: store, gateway, engine, a runner process,
the openai-SDK agent) and TRL with ``GRPOTrainer`` generating by ``model.generate``, one after the
other with one torch thread each. Equal wall time: each side's clock starts just before the call
that loads the model and trains, and is read after every optimiser step; the first step that ends
past ``--budget-s`` stops the run, and each side is tested with the weights of its last step that
ended within the budget. The starting model and both final ones are then tested the same way
(greedy ``generate`` on ``--test-problems`` held-out problems, ``completion_reward``); its own table
and its keys in the RESULT line::

    RESULT ... reward_budget_s=<s> reward_before=<acc> reward_fulgor=<acc> reward_trl=<acc>
        reward_fulgor_steps=<n> reward_trl_steps=<n> reward_fulgor_tokens_per_s=<x>
        reward_trl_tokens_per_s=<x>
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import _grpo_reward
from _offline import go_offline
from fulgor.adapters.trajectory import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater
from fulgor.engine.models import init_model

ROOT = Path(__file__).resolve().parent.parent
TRL_VERSION = "1.16.0"
TORCH_VERSION = "2.13.0"
TRL_VENV = ROOT / ".bench" / f"trl-{TRL_VERSION}"
TRL_SCRIPT = Path(__file__).resolve().parent / "_trl_grpo_step.py"
TARGET_SPEEDUP = 1.5
LEARNING_RATE = 1e-5
MAX_GRAD_NORM = 1.0
ATTN_IMPLEMENTATION = "sdpa"  # transformers' default on CPU; named so that both sides surely match


# -- the batch ------------------------------------------------------------------------------------


@dataclass
class Spec:
    groups: int
    group_size: int
    min_prompt_tokens: int
    max_prompt_tokens: int
    min_completion_tokens: int
    max_completion_tokens: int
    micro_batch: int
    threads: int
    warmup: int
    steps: int

    @property
    def sequences(self) -> int:
        return self.groups * self.group_size


def make_batch(spec: Spec, tokenizer: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Per group: the prompt's ids and its completions (ids ending in EOS, sampled logprobs, reward)."""
    rng = random.Random(seed)
    specials = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    ordinary = [i for i in range(len(tokenizer)) if i not in specials]
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    groups = []
    for _ in range(spec.groups):
        length = rng.randint(spec.min_prompt_tokens, spec.max_prompt_tokens)
        prompt = [rng.choice(ordinary) for _ in range(length)]
        completions = []
        for _ in range(spec.group_size):
            n = rng.randint(spec.min_completion_tokens, spec.max_completion_tokens)
            ids = [rng.choice(ordinary) for _ in range(n - 1)] + [eos]
            logprobs = [-rng.uniform(0.1, 6.0) for _ in range(n)]
            completions.append({"ids": ids, "logprobs": logprobs, "reward": rng.random()})
        groups.append({"prompt_ids": prompt, "completions": completions})
    return groups


def trained_tokens(groups: list[dict[str, Any]]) -> int:
    return sum(len(c["ids"]) for group in groups for c in group["completions"])


def trajectories(groups: list[dict[str, Any]]) -> list[Trajectory]:
    """The batch as fulgor's adapter hands it over: one row per rollout, the prompt under mask 0."""
    out = []
    for g, group in enumerate(groups):
        prompt = group["prompt_ids"]
        for k, completion in enumerate(group["completions"]):
            row = TrajectoryRow(
                token_ids=prompt + completion["ids"],
                loss_mask=[0] * len(prompt) + [1] * len(completion["ids"]),
                sampled_logprobs=[0.0] * len(prompt) + completion["logprobs"],
            )
            out.append(Trajectory(f"r{g}-{k}", f"g{g}", completion["reward"], [row], [None]))
    return out


# -- fulgor side ----------------------------------------------------------------------------------


def row_width(groups: list[dict[str, Any]]) -> int:
    """fulgor's padded width: the longest prompt + completion (rows are right-padded whole)."""
    return max(len(g["prompt_ids"]) + len(c["ids"]) for g in groups for c in g["completions"])


@dataclass
class Steps:
    """Per timed step: wall-clock and CPU seconds."""

    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)


def run_fulgor(spec: Spec, model_dir: Path, groups: list[dict[str, Any]]) -> Steps:
    """Timed ``PolicyUpdater.step`` calls on a freshly loaded model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION
    )
    config = GRPOConfig(
        learning_rate=LEARNING_RATE, micro_batch_size=spec.micro_batch, max_grad_norm=MAX_GRAD_NORM
    )
    updater = PolicyUpdater(model, config)
    batch = trajectories(groups)
    expected = trained_tokens(groups)
    steps = Steps()
    for i in range(spec.warmup + spec.steps):
        if torch.get_num_threads() != spec.threads:
            raise RuntimeError(f"torch uses {torch.get_num_threads()} threads, not {spec.threads}")
        wall, cpu = time.perf_counter(), time.process_time()
        metrics = updater.step(batch)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if metrics["trained_tokens"] != expected:
            raise RuntimeError(f"fulgor trained {metrics['trained_tokens']} tokens, expected {expected}")
        if i >= spec.warmup:
            steps.seconds.append(wall)
            steps.cpu_seconds.append(cpu)
    return steps


# -- TRL side -------------------------------------------------------------------------------------


def _trl_python() -> Path:
    return TRL_VENV / "bin" / "python"


def _trl_env(threads: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRL_EXPERIMENTAL_SILENCE="1",
    )
    return env


def _trl_versions() -> dict[str, str] | None:
    if not _trl_python().exists():
        return None
    probe = subprocess.run(
        [
            str(_trl_python()),
            "-c",
            "import importlib.metadata as m, json; "
            "print(json.dumps({n: m.version(n) for n in ('trl', 'torch', 'transformers')}))",
        ],
        capture_output=True,
        text=True,
        env=_trl_env(1),
        check=False,
    )
    if probe.returncode != 0:
        return None
    versions: dict[str, str] = json.loads(probe.stdout)
    return versions


def _wanted_versions() -> dict[str, str]:
    return {
        "trl": TRL_VERSION,
        "torch": TORCH_VERSION,
        "transformers": importlib.metadata.version("transformers"),
    }


def _installed_as_wanted(versions: dict[str, str] | None) -> bool:
    if versions is None:
        return False
    wanted = _wanted_versions()
    # a CPU wheel reports "2.13.0+cpu"
    return all(versions[name].split("+")[0] == version for name, version in wanted.items())


def _refuse_gpu_packages(python: Path, requirements: list[str], log: Any) -> None:
    """Stop before installing when pip would bring CUDA libraries (several GB) along."""
    plan = subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", *requirements],
        capture_output=True,
        text=True,
        env=_trl_env(1),
        check=True,
    )
    names = [item["metadata"]["name"].lower() for item in json.loads(plan.stdout)["install"]]
    log.write(f"$ pip install {' '.join(requirements)} would install: {' '.join(names)}\n")
    gpu = [name for name in names if name.startswith(("nvidia-", "cuda-")) or name == "triton"]
    if gpu:
        raise RuntimeError(
            f"installing {requirements} would pull GPU packages {gpu}; install a CPU build of "
            f"torch=={TORCH_VERSION} into {TRL_VENV} first"
        )


def ensure_trl() -> Path:
    """The python of a virtual environment with TRL, torch==2.13.0 (pinned) and this transformers."""
    if _installed_as_wanted(_trl_versions()):
        return _trl_python()
    TRL_VENV.parent.mkdir(parents=True, exist_ok=True)
    log_path = TRL_VENV.parent / f"trl-{TRL_VERSION}-install.log"
    print(f"installing trl=={TRL_VERSION} into {TRL_VENV} (log: {log_path}) ...", file=sys.stderr)
    base_python = shutil.which("python3") or sys.executable
    wanted = _wanted_versions()
    # torch first and pinned in every call: an unpinned resolve would pull a CUDA build.
    steps = [[f"torch=={TORCH_VERSION}"], [f"{name}=={version}" for name, version in wanted.items()]]
    with log_path.open("w") as log:
        if not _trl_python().exists():
            subprocess.run([base_python, "-m", "venv", str(TRL_VENV)], stdout=log, stderr=log, check=True)
        for requirements in steps:
            _refuse_gpu_packages(_trl_python(), requirements, log)
            command = [str(_trl_python()), "-m", "pip", "install", *requirements]
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=_trl_env(1), check=True)
    versions = _trl_versions()
    if not _installed_as_wanted(versions):
        raise RuntimeError(f"{TRL_VENV} has {versions}, wanted {wanted}; see {log_path}")
    return _trl_python()


def run_trl(
    python: Path, spec: Spec, model_dir: Path, groups: list[dict[str, Any]], work: Path
) -> dict[str, Any]:
    """One TRL repetition in its own environment; its JSON result."""
    spec_path = work / "trl-spec.json"
    spec_path.write_text(
        json.dumps(
            {
                "model_dir": str(model_dir),
                "attn_implementation": ATTN_IMPLEMENTATION,
                "output_dir": str(work / "trl-out"),
                "threads": spec.threads,
                "micro_batch_size": spec.micro_batch,
                "gradient_accumulation_steps": spec.sequences // spec.micro_batch,
                "group_size": spec.group_size,
                "max_completion_tokens": spec.max_completion_tokens,
                "learning_rate": LEARNING_RATE,
                "max_grad_norm": MAX_GRAD_NORM,
                "warmup_steps": spec.warmup,
                "steps": spec.steps,
                "groups": groups,
            }
        )
    )
    command = [str(python), str(TRL_SCRIPT), str(spec_path)]
    done = subprocess.run(
        command, capture_output=True, text=True, env=_trl_env(spec.threads), cwd=work, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"TRL run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"TRL run printed no JSON:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["threads"] != [spec.threads]:
        raise RuntimeError(f"TRL ran with torch threads {result['threads']}, not {spec.threads}")
    expected = trained_tokens(groups)
    if any(tokens != expected for tokens in result["trained_tokens"]):
        raise RuntimeError(f"TRL trained {result['trained_tokens']} tokens per step, expected {expected}")
    if result["attn_implementation"] != ATTN_IMPLEMENTATION:
        raise RuntimeError(
            f"TRL's model uses {result['attn_implementation']} attention, not {ATTN_IMPLEMENTATION}"
        )
    if result["checkpointing"]:
        raise RuntimeError("TRL's model recomputes activations (gradient checkpointing); fulgor's does not")
    return result


# -- report ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    size: str
    trained_tokens: int
    fulgor_width: int
    trl_width: int = 0
    fulgor: Steps = field(default_factory=Steps)
    trl: Steps = field(default_factory=Steps)
    trl_excluded_seconds: list[float] = field(default_factory=list)

    def tokens_per_s(self, steps: Steps, cpu: bool = False) -> float:
        return self.trained_tokens / statistics.median(steps.cpu_seconds if cpu else steps.seconds)

    def ratio(self, cpu: bool = False) -> float:
        return self.tokens_per_s(self.fulgor, cpu) / self.tokens_per_s(self.trl, cpu)


def print_table(spec: Spec, outcomes: list[Outcome]) -> None:
    print(
        f"\nGRPO update step: {spec.sequences} sequences ({spec.groups} prompts x {spec.group_size}), "
        f"prompt {spec.min_prompt_tokens}-{spec.max_prompt_tokens} + completion "
        f"{spec.min_completion_tokens}-{spec.max_completion_tokens} tokens, micro-batch {spec.micro_batch} "
        f"(x{spec.sequences // spec.micro_batch} accumulation), torch threads {spec.threads}, "
        f"transformers {importlib.metadata.version('transformers')}, TRL {TRL_VERSION}"
    )
    header = (
        f"{'model':<6} | {'side':<26} | {'trained tok':>11} | {'width':>5} | {'median s':>8} | "
        f"{'min-max s':>11} | {'CPU s':>6} | {'trained tok/s':>13} | {'vs TRL':>6} | {'vs TRL CPU':>10}"
    )
    print(header)
    print("-" * len(header))
    for outcome in outcomes:
        rows = [
            ("fulgor PolicyUpdater.step", outcome.fulgor, outcome.fulgor_width),
            ("TRL GRPOTrainer step", outcome.trl, outcome.trl_width),
        ]
        for label, steps, width in rows:
            ratio = outcome.tokens_per_s(steps) / outcome.tokens_per_s(outcome.trl)
            ratio_cpu = outcome.tokens_per_s(steps, cpu=True) / outcome.tokens_per_s(outcome.trl, cpu=True)
            spread = f"{min(steps.seconds):.2f}-{max(steps.seconds):.2f}"
            print(
                f"{outcome.size:<6} | {label:<26} | {outcome.trained_tokens:>11} | {width:>5} | "
                f"{statistics.median(steps.seconds):>8.3f} | {spread:>11} | "
                f"{statistics.median(steps.cpu_seconds):>6.3f} | {outcome.tokens_per_s(steps):>13.0f} | "
                f"{ratio:>5.2f}x | {ratio_cpu:>9.2f}x"
            )
    print(
        "width: padded row length (fulgor: longest prompt + completion, its widest micro-batch; TRL: "
        "longest prompt + longest completion)"
    )
    for outcome in outcomes:
        excluded = statistics.median(outcome.trl_excluded_seconds)
        print(
            f"{outcome.size}: median of {len(outcome.fulgor.seconds)} steps per side; put aside from TRL's "
            f"step (_generate_and_score_completions): median {excluded * 1000:.1f} ms"
        )


def result_line(outcomes: list[Outcome]) -> str:
    fields = []
    for outcome in outcomes:
        fields += [
            f"{outcome.size}_fulgor_tokens_per_s={outcome.tokens_per_s(outcome.fulgor):.0f}",
            f"{outcome.size}_trl_tokens_per_s={outcome.tokens_per_s(outcome.trl):.0f}",
            f"{outcome.size}_fulgor_vs_trl={outcome.ratio():.2f}",
            f"{outcome.size}_fulgor_vs_trl_cpu={outcome.ratio(cpu=True):.2f}",
        ]
    met = all(outcome.ratio() >= TARGET_SPEEDUP for outcome in outcomes)
    fields.append(f"target_met={str(met).lower()}")
    return "RESULT " + " ".join(fields)


def measure(size: str, spec: Spec, python: Path, repeats: int, root: Path) -> Outcome:
    """Build the model and the batch for ``size``; alternate fulgor and TRL ``repeats`` times."""
    from transformers import AutoTokenizer

    work = root / size
    model_dir = init_model(work / "model", size, seed=0)  # type: ignore[arg-type]
    groups = make_batch(spec, AutoTokenizer.from_pretrained(model_dir))
    outcome = Outcome(size, trained_tokens(groups), row_width(groups))
    for repeat in range(repeats):
        print(f"{size}: repetition {repeat + 1}/{repeats} ...", file=sys.stderr)
        fulgor = run_fulgor(spec, model_dir, groups)
        outcome.fulgor.seconds += fulgor.seconds
        outcome.fulgor.cpu_seconds += fulgor.cpu_seconds
        trl = run_trl(python, spec, model_dir, groups, work)
        outcome.trl.seconds += trl["seconds"]
        outcome.trl.cpu_seconds += trl["cpu_seconds"]
        outcome.trl_excluded_seconds += trl["excluded_seconds"]
        outcome.trl_width = max(trl["width"])
    return outcome


def _spec(args: argparse.Namespace) -> Spec:
    if (args.groups * args.group_size) % args.micro_batch:
        raise SystemExit("--micro-batch must divide --groups x --group-size")
    if args.group_size < 2:
        raise SystemExit("--group-size must be >= 2 (advantages compare the completions of one prompt)")
    if not 1 <= args.min_prompt_tokens <= args.max_prompt_tokens:
        raise SystemExit("need 1 <= --min-prompt-tokens <= --max-prompt-tokens")
    if not 1 <= args.min_completion_tokens <= args.max_completion_tokens:
        raise SystemExit("need 1 <= --min-completion-tokens <= --max-completion-tokens")
    return Spec(
        groups=args.groups,
        group_size=args.group_size,
        min_prompt_tokens=args.min_prompt_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        min_completion_tokens=args.min_completion_tokens,
        max_completion_tokens=args.max_completion_tokens,
        micro_batch=args.micro_batch,
        threads=args.threads,
        warmup=args.warmup,
        steps=args.steps,
    )


def main() -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--groups", type=int, default=4, help="prompts per batch")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    parser.add_argument("--min-prompt-tokens", type=int, default=48)
    parser.add_argument("--max-prompt-tokens", type=int, default=80)
    parser.add_argument("--min-completion-tokens", type=int, default=32)
    parser.add_argument("--max-completion-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, both sides")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per repetition")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per repetition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--parts", nargs="+", default=["throughput"], choices=["throughput", "reward"], help="what to run"
    )
    _grpo_reward.add_arguments(parser)
    args = parser.parse_args()
    spec = _spec(args)
    torch.set_num_threads(spec.threads)
    python = ensure_trl()
    line = "RESULT"
    if "throughput" in args.parts:
        with tempfile.TemporaryDirectory(prefix="fulgor-bench-") as root:
            outcomes = [measure(size, spec, python, args.repeats, Path(root)) for size in args.sizes]
        print_table(spec, outcomes)
        line = result_line(outcomes)
    if "reward" in args.parts:
        reward = _grpo_reward.run_reward(python, _trl_env(spec.threads), _grpo_reward.reward_spec(args))
        _grpo_reward.print_reward_table(reward, TRL_VERSION)
        line = " ".join([line, *_grpo_reward.reward_result_fields(reward)])
    print(line)


if __name__ == "__main__":
    main()
