"""``fulgor model init``: build a small local model and tokenizer in Hugging Face format."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def _init(args: argparse.Namespace) -> int:
    from fulgor.engine.errors import EngineError
    from fulgor.engine.models import init_model

    try:
        out = init_model(args.out, args.size, arch=args.arch, seed=args.seed)
    except EngineError as exc:
        print(f"fulgor model init: {exc.message}", file=sys.stderr)
        return 1
    print(out)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("model", help="build local models")
    commands = parser.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    init = commands.add_parser(
        "init",
        help="build a small causal LM and tokenizer (Hugging Face format) without a model hub",
        description="Train a tokenizer locally and build a randomly initialised model with a tool-aware chat "
        "template; serve it with `fulgor engine --model DIR`.",
    )
    init.add_argument("--out", required=True, help="directory to create (must not hold a model yet)")
    init.add_argument(
        "--size", choices=("tiny", "small"), default="tiny", help="tiny ~1M, small ~7M parameters"
    )
    init.add_argument("--arch", choices=("llama", "qwen2"), default="llama", help="transformers architecture")
    init.add_argument("--seed", type=int, default=0, help="same seed, same tokenizer and weights")
    init.set_defaults(handler=_init)
