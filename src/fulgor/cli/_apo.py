"""``fulgor train --algorithm apo``: the options of prompt optimisation, their checks, and the
:class:`fulgor.APO` they make. ``train.py`` owns the command; this module only APO's part of it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.cli._options import positive_int
from fulgor.errors import ConfigError

if TYPE_CHECKING:
    from fulgor.algorithms.base import ResourceAlgorithm

__all__ = ["APO_STEPS", "add_apo_arguments", "apo_algorithm", "check_apo_options"]

APO_STEPS = 3
"""Rounds of search when ``--steps`` is not given."""


def add_apo_arguments(parser: argparse.ArgumentParser) -> None:
    apo = parser.add_argument_group("APO (--algorithm apo): prompt optimisation")
    apo.add_argument(
        "--prompt",
        action="append",
        default=[],
        type=_prompt_entry,
        metavar="NAME=FILE",
        help="a prompt to optimise: the agent's parameter NAME gets the template in FILE (repeat for "
        "several; a .j2 or .jinja file is a jinja2 template, any other a str.format one)",
    )
    apo.add_argument("--optimizer-url", metavar="URL", help="the critic's and editor's OpenAI base URL")
    apo.add_argument("--optimizer-model", metavar="NAME", help="the critic's and editor's model")
    apo.add_argument(
        "--optimizer-key-env", metavar="VAR", help="the environment variable holding the optimiser's API key"
    )
    apo.add_argument("--critic-model", metavar="NAME", help="the critic's model, when not --optimizer-model")
    apo.add_argument("--editor-model", metavar="NAME", help="the editor's model, when not --optimizer-model")
    apo.add_argument(
        "--search", choices=("beam", "pareto"), default="beam", help="beam (default) or pareto (GEPA)"
    )
    for flag, default, what in (
        ("--beam-width", 4, "candidates the beam keeps"),
        ("--branch-factor", 4, "proposals from each beam parent per round"),
        ("--proposals", 4, "proposals per round with --search pareto"),
        ("--gradient-batch-size", 4, "training tasks the critic sees per proposal"),
        ("--val-batch-size", 16, "validation tasks that rank the beam each round"),
    ):
        apo.add_argument(
            flag, type=positive_int, default=default, metavar="N", help=f"{what} (default {default})"
        )
    apo.add_argument("--max-rollouts", type=positive_int, metavar="N", help="stop once N rollouts are used")
    apo.add_argument(
        "--max-optimizer-calls", type=positive_int, metavar="N", help="stop once N optimiser calls are used"
    )


def _prompt_entry(text: str) -> tuple[str, Path]:
    name, equals, path = text.partition("=")
    if not equals or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=FILE, e.g. prompt_template=prompt.txt")
    return name, Path(path)


def check_apo_options(args: argparse.Namespace) -> None:
    """Prompts to optimise, and (for training) an optimiser and validation tasks."""
    if not args.prompt:
        raise ConfigError(
            "--algorithm apo optimises the prompts of --prompt NAME=FILE (NAME: the agent's parameter "
            "that takes the prompt); pass at least one"
        )
    names = [name for name, _ in args.prompt]
    if len(set(names)) != len(names):
        raise ConfigError(f"--prompt names a prompt twice ({', '.join(names)}); name each once")
    if args.dev or args.evaluate:
        return
    if args.optimizer_url is None or (
        args.optimizer_model is None and None in (args.critic_model, args.editor_model)
    ):
        raise ConfigError(
            "--algorithm apo needs its critic and editor: --optimizer-url URL (any OpenAI-compatible "
            "server) and --optimizer-model NAME (or --critic-model and --editor-model)"
        )
    if args.optimizer_key_env is not None and not os.environ.get(args.optimizer_key_env):
        raise ConfigError(
            f"--optimizer-key-env {args.optimizer_key_env}: that environment variable is not set; "
            "export the optimiser's API key in it"
        )
    if args.val is None:
        raise ConfigError("--algorithm apo scores its candidate prompts on --val FILE; pass --val")


def _read_prompts(entries: Sequence[tuple[str, Path]]) -> dict[str, Any]:
    from fulgor.types import PromptTemplate

    prompts = {}
    for name, path in entries:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(
                f"--prompt {name}={path}: cannot read it ({error}); pass a UTF-8 text file"
            ) from None
        engine = "jinja" if path.suffix in (".j2", ".jinja", ".jinja2") else "f-string"
        prompts[name] = PromptTemplate(template=text.rstrip("\n"), engine=engine)
    return prompts


def apo_algorithm(args: argparse.Namespace) -> ResourceAlgorithm:
    from fulgor import APO, LLM

    critic = editor = None
    if args.optimizer_url is not None:
        key = os.environ[args.optimizer_key_env] if args.optimizer_key_env else None
        url, model = args.optimizer_url, args.optimizer_model
        critic = LLM(endpoint=url, model=args.critic_model or model, api_key=key)
        editor = LLM(endpoint=url, model=args.editor_model or model, api_key=key)
    return APO(
        prompts=_read_prompts(args.prompt),
        critic=critic,
        editor=editor,
        search=args.search,
        beam_width=args.beam_width,
        branch_factor=args.branch_factor,
        proposals_per_step=args.proposals,
        max_steps=args.steps or APO_STEPS,
        gradient_batch_size=args.gradient_batch_size,
        val_batch_size=args.val_batch_size,
        max_rollouts=args.max_rollouts,
        max_optimizer_calls=args.max_optimizer_calls,
        max_seconds=args.max_seconds,
        temperature=args.temperature,
        seed=args.seed,
    )
