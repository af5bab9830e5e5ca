"""``fulgor model init``: build a small local model and tokenizer in Hugging Face format;
``fulgor model import``: make a GGUF file or a Hugging Face directory a model directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _init(args: argparse.Namespace) -> int:
    from fulgor.engine.models import init_model
    from fulgor.weights.errors import ModelLoadError

    try:
        corpus = _read_corpus(args.corpus) if args.corpus else []
        out = init_model(
            args.out, args.size, arch=args.arch, seed=args.seed, corpus=corpus, tokenizer=args.tokenizer
        )
    except (ModelLoadError, ImportError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    print(out)
    return 0


def _import(args: argparse.Namespace) -> int:
    from fulgor.weights.errors import ModelLoadError
    from fulgor.weights.importing import describe_model, import_model

    try:
        out = import_model(args.source, args.out, dtype=args.dtype, link=args.link)
    except (ModelLoadError, ImportError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    print(out)
    print(f"{describe_model(out).summary()}; check it with `fulgor doctor --model {out}`", file=sys.stderr)
    return 0


def _read_corpus(path: str) -> list[str]:
    from fulgor.weights.errors import ModelLoadError

    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read --corpus {path}: {exc}; pass a UTF-8 text file") from exc


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("model", help="build or import local models")
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
    init.add_argument(
        "--corpus",
        metavar="FILE",
        help="UTF-8 text of the task (prompts, transcripts) the tokenizer also learns from; "
        "its prompts then take fewer tokens",
    )
    init.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="build the model on this tokenizer (a real model's tokenizer.json and tokenizer_config.json, "
        "with its chat template) instead of training fulgor's own",
    )
    init.set_defaults(handler=_init)
    imported = commands.add_parser(
        "import",
        help="make a GGUF file or a Hugging Face directory a model directory fulgor and vLLM load",
        description="A GGUF file (llama.cpp, an Ollama blob) is dequantised and saved in Hugging Face "
        "format with its tokenizer and chat template; a Hugging Face directory is checked and copied "
        "(or linked). Nothing is downloaded.",
    )
    imported.add_argument("source", help="a GGUF file or a Hugging Face model directory")
    imported.add_argument("--out", required=True, help="directory to create (must not hold anything yet)")
    imported.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help="what a GGUF file's weights are dequantised to (default bfloat16)",
    )
    imported.add_argument(
        "--link", action="store_true", help="link a directory's files instead of copying them"
    )
    imported.set_defaults(handler=_import)
