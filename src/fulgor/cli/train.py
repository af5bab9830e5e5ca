"""``fulgor train``: train an existing agent's model with GRPO or SFT, or its prompts with APO.

``fulgor train --agent module:object --train tasks.jsonl --model DIR`` runs :class:`fulgor.Trainer`
with :class:`fulgor.GRPO` (``--algorithm grpo``, the default) or :class:`fulgor.SFT` (``--algorithm
sft``: the agent's own best rollouts by ``--min-reward`` / ``--top-k``, or a teacher run's with
``--from-run DIR``) or :class:`fulgor.APO` (``--algorithm apo``: the prompts of ``--prompt
NAME=FILE`` improved by the critic and editor at ``--optimizer-url``, on a local ``--model`` or
an ``--upstream``; it prints the best prompts and where they are written). ``--dev`` runs the
agent once on each task without training (the quickest check of an agent, its rewards and its
token ids) and ``--evaluate`` measures the ``--val`` tasks with the newest weights (and, for
APO, the best prompts) of the run in ``--run-dir``. ``--nproc N`` runs the GRPO update across N
processes: the command runs itself again under torchrun (``torch.distributed.run``), rank 0 as
the trainer and the others in the update only (:mod:`fulgor.training.distributed`).
``--runners ray`` runs the runners as Ray actors (:class:`fulgor.RayRunners`): on a Ray instance
the run starts on this machine and keeps on loopback, or on the running cluster at
``--ray-address``. ``--upstream URL`` sends the agent's calls to an OpenAI-compatible server instead
of a local model, for ``--dev``, ``--evaluate`` (recording a teacher's rollouts, say) and APO: no weights
train there. Without ``--run-dir``, training and ``--dev`` start a new
``runs/train-<date>-<time>``; the command prints the ``--run-dir`` that continues it. Task files
are JSON Lines, one task (any JSON value) per line.

Every input (task files, model directory, run directory, device, agent, settings) is checked
before any service starts; a bad one is one ``error:`` line and exit status 2. A missing extra, a
run that fails, or a ``--dev`` or ``--evaluate`` with a rollout that did not succeed is status 1;
Ctrl+C stops every service and is status 130.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.cli._apo import APO_STEPS, add_apo_arguments, apo_algorithm, check_apo_options
from fulgor.cli._nproc import add_update_arguments, check_update_options, rank, run_ranks
from fulgor.cli._options import add_chat_arguments, non_negative_float, positive_float, positive_int
from fulgor.cli._stopping import interrupts
from fulgor.errors import ConfigError, FulgorError

if TYPE_CHECKING:
    from fulgor.agent.base import Runnable
    from fulgor.algorithms.base import Algorithm, ResourceAlgorithm
    from fulgor.training import Trainer
    from fulgor.weights.lora import LoraConfig

__all__ = ["check_model_dir", "read_tasks", "register"]

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
ALGORITHMS = ("grpo", "sft", "apo")
_LEARNING_RATES = {"grpo": 3e-5, "sft": 1e-3}
_STEPS = {"grpo": 100, "sft": 100, "apo": APO_STEPS}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train an agent's model with GRPO or SFT, or its prompts with APO (or --dev / --evaluate it)",
        description="Train the model behind an existing agent with GRPO or SFT: the agent runs "
        "unchanged, its model calls go through fulgor's gateway to a local engine, and each step "
        "updates the weights. Task files are JSON Lines: one task (any JSON value) per line.",
    )
    parser.add_argument(
        "--agent", required=True, help="the agent as module:object (a @rollout function or an Agent)"
    )
    parser.add_argument("--train", type=Path, metavar="FILE", help="training tasks (JSON Lines)")
    parser.add_argument("--val", type=Path, metavar="FILE", help="validation tasks (JSON Lines), greedy")
    parser.add_argument(
        "--model",
        type=Path,
        metavar="DIR",
        help="local Hugging Face model directory to start from (fulgor downloads nothing)",
    )
    add_chat_arguments(parser)
    parser.add_argument(
        "--upstream",
        metavar="URL",
        help="instead of --model: an OpenAI-compatible server (http://host:port/v1: vLLM, a hosted "
        "API) for --dev and --evaluate; its weights are its own, so nothing trains there",
    )
    parser.add_argument(
        "--upstream-model",
        metavar="NAME",
        help="the model the upstream serves the agent's calls with (default: the one its /models lists)",
    )
    parser.add_argument(
        "--upstream-key-env",
        metavar="VAR",
        help="the environment variable that holds the upstream's API key (sent to it as a bearer token)",
    )
    parser.add_argument(
        "--no-token-ids",
        action="store_true",
        help="do not ask the upstream for token ids (return_token_ids): for APIs that refuse unknown "
        "fields; its calls are recorded without ids",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where the run keeps its checkpoints, metrics and store; pass it again to continue the "
        "run (default for training and --dev: a new runs/train-<date>-<time>)",
    )
    parser.add_argument(
        "--limit", type=positive_int, metavar="N", help="only the first N tasks of each file (a quick --dev)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--dev",
        action="store_true",
        help="run the agent once on each --train task without training and print each rollout's "
        "status, reward, model calls and token drift",
    )
    mode.add_argument(
        "--evaluate",
        action="store_true",
        help="measure the --val tasks (greedy) with the newest weights of the run in --run-dir "
        "instead of training",
    )
    grpo = parser.add_argument_group("training (GRPO and SFT)")
    grpo.add_argument(
        "--algorithm",
        default="grpo",
        metavar="NAME",
        help=f"the training algorithm: {', '.join(ALGORITHMS)} (default grpo)",
    )
    grpo.add_argument(
        "--steps",
        type=positive_int,
        metavar="N",
        help="training steps (default 100; APO: 3 rounds of search)",
    )
    grpo.add_argument(
        "--max-seconds",
        type=positive_float,
        metavar="SECONDS",
        help="stop after the step that ends past this wall time",
    )
    grpo.add_argument(
        "--group-size",
        type=positive_int,
        default=8,
        metavar="N",
        help="rollouts per task (default 8): GRPO compares them, SFT selects among them",
    )
    grpo.add_argument(
        "--batch-tasks", type=positive_int, default=8, metavar="N", help="tasks per step (default 8)"
    )
    grpo.add_argument(
        "--learning-rate", type=positive_float, metavar="LR", help="default 3e-5 (GRPO), 1e-3 (SFT)"
    )
    grpo.add_argument(
        "--temperature",
        type=non_negative_float,
        default=1.0,
        metavar="T",
        help="sampling temperature (default 1.0)",
    )
    grpo.add_argument(
        "--max-tokens",
        type=positive_int,
        default=256,
        metavar="N",
        help="tokens per model call (default 256)",
    )
    grpo.add_argument(
        "--val-every", type=positive_int, default=10, metavar="N", help="validate every N steps (default 10)"
    )
    grpo.add_argument(
        "--seed", type=int, default=0, metavar="N", help="task order and sampling seed (default 0)"
    )
    grpo.add_argument(
        "--agent-match",
        metavar="REGEX",
        help="train only the calls of agents whose name this regular expression matches (a multi-agent "
        "system: names come from X-Fulgor-Agent headers or the agent's OpenTelemetry spans)",
    )
    lora = parser.add_argument_group("LoRA (GRPO and SFT): train a low-rank adapter instead of all weights")
    lora.add_argument(
        "--lora-rank",
        type=positive_int,
        metavar="R",
        help="train a LoRA adapter of rank R over frozen weights; each checkpoint holds only the adapter",
    )
    lora.add_argument(
        "--lora-alpha", type=positive_float, metavar="A", help="the update is scaled by A/R (default 2R)"
    )
    lora.add_argument(
        "--lora-dropout",
        type=non_negative_float,
        default=0.0,
        metavar="P",
        help="dropout on the adapter (default 0)",
    )
    lora.add_argument(
        "--lora-target-modules",
        nargs="+",
        metavar="NAME",
        help="the modules that get an adapter, e.g. q_proj v_proj (default: every linear layer but the "
        "output head)",
    )
    sft = parser.add_argument_group("SFT (--algorithm sft)")
    sft.add_argument(
        "--min-reward",
        type=float,
        metavar="R",
        help="learn the rollouts whose reward is at least R",
    )
    sft.add_argument(
        "--top-k", type=positive_int, metavar="K", help="learn the best K rollouts of each task's group"
    )
    sft.add_argument(
        "--from-run",
        type=Path,
        metavar="DIR",
        help="distil: learn the recorded rollouts of this teacher run (its store.sqlite) instead of "
        "the agent's own; steps run no rollouts",
    )
    sft.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        metavar="N",
        help="teacher transcripts per step with --from-run (default 32)",
    )
    add_apo_arguments(parser)
    _add_system_arguments(parser, grpo)
    parser.set_defaults(handler=_run)


def _add_system_arguments(parser: argparse.ArgumentParser, grpo: Any) -> None:
    """The runners, the device, the update across processes (into ``grpo`` too) and checkpoints."""
    system = parser.add_argument_group("system")
    system.add_argument("--n-runners", type=positive_int, default=2, metavar="N", help="runners (default 2)")
    system.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=8,
        metavar="N",
        help="rollouts at once per runner (default 8)",
    )
    system.add_argument(
        "--runner-python",
        type=Path,
        metavar="PYTHON",
        help="run the runner processes on this Python: the agent's own virtual environment (e.g. one "
        "whose packages clash with this one's), with fulgor installed there too",
    )
    system.add_argument(
        "--runners",
        choices=("processes", "ray"),
        default="processes",
        help="where the runners run: processes on this machine (default), or Ray actors: on a Ray "
        "instance the run starts on this machine (on loopback), or on the cluster of --ray-address",
    )
    system.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="with --runners ray: join this running Ray cluster (auto, HOST:PORT or ray://HOST:10001) "
        "instead of starting an instance; it is left running",
    )
    system.add_argument("--device", default="auto", help="auto (default), cpu, mps, cuda or cuda:N")
    add_update_arguments(grpo, system)
    system.add_argument(
        "--no-resume",
        action="store_true",
        help="refuse a --run-dir that already holds checkpoints instead of continuing it",
    )
    system.add_argument(
        "--keep-checkpoints",
        type=int,
        default=2,
        metavar="N",
        help="keep the newest N checkpoints and the one with the best validation accuracy, deleting "
        "the others as training goes (default 2; 0 keeps every one)",
    )


@dataclass(frozen=True)
class _Job:
    """What the command was asked to do, with every input read and checked."""

    train: list[Any]
    val: list[Any]
    run_dir: Path


def read_tasks(path: Path, option: str = "--train") -> list[Any]:
    """The tasks of a JSON Lines file (blank lines skipped); a ConfigError names the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{option} {path} does not exist; pass a JSON Lines file of tasks") from None
    except IsADirectoryError:
        raise ConfigError(f"{option} {path} is a directory; pass a JSON Lines file of tasks") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{option} {path} is not UTF-8 text; write one JSON value per line") from None
    except OSError as error:
        raise ConfigError(f"cannot read {option} {path}: {error.strerror}") from None
    tasks = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{option} {path}, line {number}: not JSON ({error.msg} at column {error.colno}); "
                "write one task per line as a JSON value"
            ) from None
    if not tasks:
        raise ConfigError(f"{option} {path} holds no tasks; write one task per line as a JSON value")
    return tasks


def _run(args: argparse.Namespace) -> int:
    try:
        job = _check_inputs(args)
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    try:
        _require_extras(torch=args.upstream is None, ray=args.runners == "ray")
        if args.upstream is None:
            _check_device(args.device, args.nproc)
        trainer = _trainer(args, job.run_dir)
        agent = _load_agent(args.agent)
    except ImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    _quiet_request_logs(args.verbose)
    with interrupts():  # SIGTERM stops in order as Ctrl+C does
        if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
            return run_ranks(args, job.run_dir)
        return _train(args, job, trainer, agent)


def _train(args: argparse.Namespace, job: _Job, trainer: Trainer, agent: Any) -> int:
    try:
        if rank() > 0:  # a rank of the update only: rank 0 reports
            trainer.fit(agent, job.train, job.val)
            return 0
        if args.dev:
            return _dev(trainer, agent, job)
        if args.evaluate:
            return _evaluate(trainer, agent, job, args.model)
        return _fit(trainer, agent, job, args.agent)
    except (FulgorError, ImportError) as error:
        print(f"error: {getattr(error, 'message', error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if rank() > 0:  # rank 0 says how to continue
            pass
        elif args.dev or args.evaluate:
            print("\ninterrupted", file=sys.stderr)
        else:
            print(
                f"\ninterrupted: {job.run_dir} keeps every finished step; to continue, run the same "
                f"command with --run-dir {job.run_dir}",
                file=sys.stderr,
            )
        return 130


def _check_inputs(args: argparse.Namespace) -> _Job:
    """Every file and setting, before anything starts: one ConfigError for the first bad one."""
    if args.evaluate and args.val is None:
        raise ConfigError("--evaluate measures the held-out tasks of --val FILE; pass --val")
    if not args.evaluate and args.train is None:
        what = "--dev runs the agent on" if args.dev else "training needs"
        raise ConfigError(f"{what} the tasks of --train FILE; pass --train (JSON Lines, one task per line)")
    if (args.model is None) == (args.upstream is None):
        raise ConfigError(
            "pass --model DIR (a local model to train) or --upstream URL (a server to --dev or "
            "--evaluate against), one of them"
        )
    if args.upstream is not None and not (args.dev or args.evaluate) and args.algorithm != "apo":
        raise ConfigError(
            f"--algorithm {args.algorithm} changes the model's weights, and --upstream {args.upstream} is "
            "a server fulgor does not own, whose weights it cannot change; train a local model with "
            "--model DIR, or record the upstream's rollouts with --dev (a teacher run for --from-run)"
        )
    if args.upstream is None and (args.upstream_model or args.upstream_key_env or args.no_token_ids):
        raise ConfigError("--upstream-model, --upstream-key-env and --no-token-ids go with --upstream URL")
    if args.upstream_key_env is not None and not os.environ.get(args.upstream_key_env):
        raise ConfigError(
            f"--upstream-key-env {args.upstream_key_env}: that environment variable is not set; export "
            "the upstream's API key in it"
        )
    _check_chat_options(args)
    _check_lora_options(args)
    _check_runner_options(args)
    if args.evaluate and args.run_dir is None and args.upstream is None:
        raise ConfigError(
            "--evaluate measures the weights of a run (its newest checkpoint); pass its --run-dir"
        )
    _check_algorithm_options(args)
    check_update_options(args)
    if args.keep_checkpoints < 0:
        raise ConfigError(
            f"--keep-checkpoints {args.keep_checkpoints} is negative; pass 0 to keep every checkpoint, "
            "or N to keep the newest N and the best validated one"
        )
    if not _DEVICE.fullmatch(args.device):
        raise ConfigError(f"--device {args.device} is not a device; pass auto, cpu, mps, cuda or cuda:N")
    train = read_tasks(args.train, "--train") if args.train is not None else []
    val = read_tasks(args.val, "--val") if args.val is not None else []
    if args.limit is not None:
        train, val = train[: args.limit], val[: args.limit]
    if args.model is not None:
        check_model_dir(args.model)
        adapter = args.model / "adapter_config.json"
        if adapter.is_file() and args.lora_rank is None and not (args.dev or args.evaluate):
            raise ConfigError(
                f"--model {args.model} is a LoRA adapter: pass --lora-rank (and --lora-alpha) as it was "
                "trained with, to train it further over the base model it names"
            )
    run_dir = args.run_dir or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    _check_run_dir(run_dir)
    if not (args.dev or args.evaluate):
        _check_continuation(run_dir, args.no_resume, lora=args.lora_rank is not None)
    return _Job(train=train, val=val, run_dir=run_dir)


def _check_lora_options(args: argparse.Namespace) -> None:
    """LoRA's shape goes with --lora-rank, on an algorithm that trains weights, in one process."""
    shaped = args.lora_alpha is not None or args.lora_dropout or args.lora_target_modules
    if args.lora_rank is None and shaped:
        raise ConfigError(
            "--lora-alpha, --lora-dropout and --lora-target-modules shape the adapter of --lora-rank R"
        )
    if args.lora_rank is None:
        return
    if args.algorithm == "apo":
        raise ConfigError("--lora-rank trains an adapter; --algorithm apo trains prompts: drop --lora-rank")
    if args.nproc > 1:
        raise ConfigError(
            "--nproc shards the update of all weights; a LoRA adapter trains in one process: drop --nproc"
        )


_CHAT_OPTIONS = ("chat_template", "tool_call_parser", "reasoning_parser")


def _check_chat_options(args: argparse.Namespace) -> None:
    """The template and parsers go with the engine fulgor starts, and the template reads."""
    from fulgor.engine.chat_format import check_chat_options

    given = [f"--{name.replace('_', '-')}" for name in _CHAT_OPTIONS if getattr(args, name) is not None]
    if given and args.upstream is not None:
        raise ConfigError(
            f"{', '.join(given)} go with the engine fulgor starts on --model; an --upstream renders "
            "and parses with its own settings: drop them, or set them where it is served"
        )
    check_chat_options(args.chat_template, args.tool_call_parser, args.reasoning_parser)


def _check_runner_options(args: argparse.Namespace) -> None:
    if args.ray_address is not None and args.runners != "ray":
        raise ConfigError("--ray-address names the Ray cluster of --runners ray; pass --runners ray too")
    if args.runners == "ray" and args.runner_python is not None:
        raise ConfigError(
            "--runner-python starts runner processes on another Python; Ray actors run on the Python "
            "of Ray's workers: pass one of --runners ray and --runner-python"
        )


def _check_algorithm_options(args: argparse.Namespace) -> None:
    """An algorithm that exists, with the options it takes."""
    if args.algorithm not in ALGORITHMS:
        raise ConfigError(f"--algorithm {args.algorithm} does not exist; pass one of {', '.join(ALGORITHMS)}")
    if args.algorithm == "apo":
        check_apo_options(args)
        return
    sft_only = [
        name
        for name, value in (
            ("--min-reward", args.min_reward),
            ("--top-k", args.top_k),
            ("--from-run", args.from_run),
        )
        if value is not None
    ]
    if args.algorithm == "grpo":
        if sft_only and not (args.dev or args.evaluate):
            raise ConfigError(
                f"{', '.join(sft_only)} go with --algorithm sft; GRPO learns from every rollout"
            )
        if args.group_size < 2:
            raise ConfigError("--group-size must be 2 or more: GRPO compares the rollouts of each task")
        return
    if not sft_only and not (args.dev or args.evaluate):
        raise ConfigError(
            "--algorithm sft needs to know what to imitate: --min-reward R (rollouts with reward >= R), "
            "--top-k K (the best K of each group), both, or --from-run DIR (a teacher run's rollouts)"
        )
    if args.top_k is not None and args.top_k > args.group_size:
        raise ConfigError(
            f"--top-k {args.top_k} is more than --group-size {args.group_size}; pass at most that"
        )
    if args.from_run is not None and not (args.from_run / "store.sqlite").is_file():
        raise ConfigError(
            f"--from-run {args.from_run} holds no store.sqlite; pass the --run-dir of a run that recorded "
            "the teacher's rollouts (fulgor train --dev --upstream URL, say)"
        )


def _check_run_dir(run_dir: Path) -> None:
    """A directory the run can be written into (it, or the nearest folder above it that exists)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file; pass a directory for the run")
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--run-dir {run_dir}: {existing} is a file; pass a directory for the run")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--run-dir {run_dir}: {existing} is not writable; pass a directory you can write")


def _check_continuation(run_dir: Path, no_resume: bool, *, lora: bool) -> None:
    """Training continues a run's checkpoints: refused with --no-resume, and when the run trained
    the other way (all weights, or a LoRA adapter)."""
    from fulgor.training.checkpoints import latest_checkpoint
    from fulgor.weights.loading import checkpoint_kind
    from fulgor.weights.lora import adapter_set

    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        return
    step, path = latest
    if no_resume:
        raise ConfigError(
            f"--run-dir {run_dir} already holds checkpoints up to step {step}; pick a new "
            "--run-dir, or drop --no-resume to continue that run"
        )
    if adapter_set(path) is not None:
        raise ConfigError(
            f"--run-dir {run_dir} holds one LoRA adapter per agent (up to step {step}); pick a new "
            "--run-dir, or continue that run from Python with Trainer and GRPO(adapters=...)"
        )
    if (checkpoint_kind(path) == "lora") != lora:
        trained, asked = ("a LoRA adapter", "all weights") if not lora else ("all weights", "a LoRA adapter")
        raise ConfigError(
            f"--run-dir {run_dir} trained {trained} (checkpoints up to step {step}) and this command trains "
            f"{asked}; pick a new --run-dir, or continue it as it trained "
            f"({'with --lora-rank R' if not lora else 'without --lora-rank'})"
        )


def check_model_dir(model: Path) -> None:
    """A local Hugging Face model directory (``config.json``) or LoRA adapter directory
    (``adapter_config.json``), or a ConfigError that says what to pass."""
    if not model.is_dir():
        raise ConfigError(
            f"--model {model} is not a directory; pass a local Hugging Face model directory (fulgor "
            "downloads nothing; `fulgor model import` makes one of a GGUF file), or build a small one "
            "with `fulgor model init --out DIR`"
        )
    if not (model / "config.json").is_file() and not (model / "adapter_config.json").is_file():
        raise ConfigError(
            f"--model {model} has no config.json; pass the directory that holds the model's "
            "config.json, tokenizer files and weights, or a LoRA adapter's (adapter_config.json)"
        )


def _check_device(device: str, nproc: int = 1) -> None:
    """A device this machine has (torch is importable by now; ``auto`` always is), and one for each
    of ``nproc`` ranks."""
    from fulgor.weights.loading import require_torch, resolve_device

    resolved = resolve_device(device)  # a ModelLoadError for CUDA without a GPU
    torch = require_torch()
    if resolved.startswith("cuda:") and int(resolved[5:]) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ConfigError(
            f"device {device!r} was asked for but this machine has {count} CUDA GPU(s), numbered from 0; "
            "use --device cuda:N with a smaller N, or --device cpu"
        )
    if resolved == "cuda" and nproc > torch.cuda.device_count():
        raise ConfigError(
            f"--nproc {nproc} needs a CUDA GPU per rank and this machine has {torch.cuda.device_count()}; "
            "pass a smaller --nproc, or --device cpu"
        )
    if resolved == "mps" and nproc > 1:
        raise ConfigError("--nproc runs on the CPU (gloo) or CUDA GPUs (NCCL), not on MPS; pass --device cpu")
    if resolved == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device {device!r} was asked for but Apple's MPS is not available; use --device cpu"
        )


def _require_extras(*, torch: bool, ray: bool) -> None:
    """torch and transformers (for a local model), the server the run's services need, and Ray for
    Ray runners, or an ImportError naming the extra."""
    from fulgor.weights.loading import require_torch

    if torch:
        require_torch()
    # Found, not imported: a Ray instance the run starts reads its switches when Ray is imported.
    if ray and importlib.util.find_spec("ray") is None:
        raise ImportError("--runners ray needs Ray: pip install 'fulgor[ray]'")
    # Each names fulgor[server] when missing.
    for module in ("fulgor.gateway", "fulgor.engine.app") if torch else ("fulgor.gateway",):
        importlib.import_module(module)


def _algorithm(args: argparse.Namespace) -> Algorithm | ResourceAlgorithm:
    from fulgor import GRPO, SFT
    from fulgor.algorithms.grpo import GRPOConfig
    from fulgor.algorithms.sft import SFTConfig

    if args.algorithm == "apo":
        return apo_algorithm(args)
    common = {
        "group_size": args.group_size,
        "batch_tasks": args.batch_tasks,
        "max_steps": args.steps or _STEPS[args.algorithm],
        "max_seconds": args.max_seconds,
        "val_every": args.val_every,
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "agent_match": args.agent_match,
    }
    learning_rate = args.learning_rate or _LEARNING_RATES[args.algorithm]
    lora = _lora(args)
    if args.algorithm == "grpo":
        config = GRPOConfig(
            learning_rate=learning_rate,
            gradient_checkpointing=args.gradient_checkpointing,
            compute_dtype=args.compute_dtype,
        )
        return GRPO(**common, config=config, lora=lora)
    # Without training the rule plays no part, and may be left out.
    ruleless = args.min_reward is None and args.top_k is None and args.from_run is None
    return SFT(
        **common,
        min_reward=args.min_reward,
        top_k=1 if ruleless else args.top_k,
        from_run=args.from_run,
        batch_size=args.batch_size,
        config=SFTConfig(learning_rate=learning_rate, compute_dtype=args.compute_dtype),
        lora=lora,
    )


def _lora(args: argparse.Namespace) -> LoraConfig | None:
    from fulgor.weights.lora import LoraConfig

    if args.lora_rank is None:
        return None
    targets = tuple(args.lora_target_modules) if args.lora_target_modules else "all-linear"
    alpha = args.lora_alpha if args.lora_alpha is not None else 2.0 * args.lora_rank
    return LoraConfig(rank=args.lora_rank, alpha=alpha, dropout=args.lora_dropout, target_modules=targets)


def _trainer(args: argparse.Namespace, run_dir: Path) -> Trainer:
    from fulgor import RayRunners, Trainer
    from fulgor.engine.local import EngineConfig
    from fulgor.gateway import Upstream

    target: dict[str, Any]
    chat = {name: getattr(args, name) for name in _CHAT_OPTIONS}
    if args.upstream is not None:
        api_key = os.environ[args.upstream_key_env] if args.upstream_key_env else None
        upstream = Upstream(args.upstream, api_key=api_key, request_token_ids=not args.no_token_ids)
        target = {"upstream": upstream, "model": args.upstream_model}
    else:
        target = {"engine": EngineConfig(model=args.model, device=args.device, seed=args.seed, **chat)}
    return Trainer(
        algorithm=_algorithm(args),
        **target,
        run_dir=run_dir,
        n_runners=args.n_runners,
        max_concurrency=args.max_concurrency,
        runner_python=args.runner_python,
        runners=RayRunners(address=args.ray_address) if args.runners == "ray" else None,
        resume=not args.no_resume,
        keep_checkpoints=args.keep_checkpoints,
        progress=sys.stderr.isatty(),
    )


def _load_agent(spec: str) -> Runnable:
    from fulgor.runner.pool import load_agent

    return load_agent(spec)


def _quiet_request_logs(verbose: bool) -> None:
    from fulgor.training.reports import QUIET_LOGGERS

    if not verbose:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def _dev(trainer: Trainer, agent: Runnable, job: _Job) -> int:
    report = trainer.dev(agent, job.train)
    print(report)
    _print_where(job.run_dir, ("store (rollouts, spans)", "runner log"))
    failed = [r for r in report.rollouts if r.status != "succeeded"]
    unrewarded = [r for r in report.rollouts if r.status == "succeeded" and r.reward is None]
    if unrewarded:
        print(
            f"warning: {len(unrewarded)} rollout(s) succeeded without a reward: return one from the "
            "agent or emit it with fulgor.emit_reward, else training has nothing to learn from",
            file=sys.stderr,
        )
    if failed:
        print(
            f"error: {len(failed)} of {len(report.rollouts)} rollouts did not succeed; see the errors "
            f"above and {job.run_dir / 'logs' / 'runners.log'}",
            file=sys.stderr,
        )
        return 1
    return 0


def _evaluate(trainer: Trainer, agent: Runnable, job: _Job, model: Path | None) -> int:
    """Measure ``job.val``; the JSON line names the checkpoint step measured (0: ``model`` itself,
    or the upstream's model)."""
    from fulgor.training.checkpoints import latest_checkpoint

    latest = latest_checkpoint(job.run_dir / "checkpoints")
    if latest is None and model is not None:
        print(
            f"note: {job.run_dir} has no checkpoint yet, so this measures the weights of --model {model}",
            file=sys.stderr,
        )
    metrics = trainer.evaluate(agent, job.val)
    print(json.dumps({**metrics, "tasks": len(job.val), "step": 0 if latest is None else latest[0]}))
    _print_where(job.run_dir, ("store (rollouts, spans)", "runner log"))
    failed = int(metrics["val_rollouts_failed"])
    if failed:
        print(
            f"error: {failed} of {len(job.val)} rollouts did not succeed (each counts 0 in val_accuracy); "
            f"see {job.run_dir / 'logs' / 'runners.log'}",
            file=sys.stderr,
        )
        return 1
    return 0


def _fit(trainer: Trainer, agent: Runnable, job: _Job, agent_spec: str) -> int:
    from fulgor.training.run_report import read_metrics, text_curve, write_run_report

    trainer.fit(agent, job.train, job.val)
    history = read_metrics(job.run_dir)
    print()
    print(text_curve(history))
    try:
        write_run_report(job.run_dir, title=f"fulgor train {agent_spec}")
    except ConfigError as error:  # matplotlib missing: the metrics are all there, the PNG is not
        print(f"warning: no report.html: {error.message}", file=sys.stderr)
    best = job.run_dir / "apo" / "best.json"
    if best.is_file():
        _print_best_prompts(best)
    print()
    _print_where(job.run_dir, tuple(_PATHS))
    print(f"\n  continue: the same command with --run-dir {job.run_dir} and a larger --steps")
    return 0


def _print_best_prompts(best: Path) -> None:
    """The best prompts of a prompt search, each with the file that holds it."""
    summary = json.loads(best.read_text())
    score = "-" if summary.get("score") is None else f"{summary['score']:.3f}"
    print(f"\nbest prompts (candidate {summary['id']}, validation score {score}):")
    for name, prompt in summary["prompts"].items():
        print(f"\n--- {name}: {best.parent / 'best' / f'{name}.txt'}\n{prompt['template']}")


# What a run directory holds, as the trainer and the run report lay it out.
_PATHS = {
    "report": "report.html",
    "curves": "curves.png",
    "metrics per step": "metrics.jsonl",
    "store (rollouts, spans)": "store.sqlite",
    "checkpoints": "checkpoints",
    "prompt search history": "apo/candidates.json",
    "runner log": "logs/runners.log",
}


def _print_where(run_dir: Path, labels: Sequence[str]) -> None:
    for label in labels:
        path = run_dir / _PATHS[label]
        if path.exists():
            print(f"  {label:<24} {path}")
    print(f"  look inside: fulgor store rollouts --store sqlite:///{run_dir / 'store.sqlite'}")
    print(f"  in a browser (every rollout, model call and token): fulgor dashboard {run_dir}")
