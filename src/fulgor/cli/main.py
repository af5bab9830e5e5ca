"""``fulgor`` entry point: one argparse parser, one module per command group.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``handler``
(a function ``(args) -> int``). Command modules import heavy dependencies inside their handlers,
so ``fulgor --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from fulgor import __version__
from fulgor.cli import dashboard as dashboard_cli
from fulgor.cli import demo as demo_cli
from fulgor.cli import doctor as doctor_cli
from fulgor.cli import engine as engine_cli
from fulgor.cli import gateway as gateway_cli
from fulgor.cli import model as model_cli
from fulgor.cli import runner as runner_cli
from fulgor.cli import serve as serve_cli
from fulgor.cli import store as store_cli
from fulgor.cli import train as train_cli

COMMAND_MODULES = (
    store_cli,
    engine_cli,
    model_cli,
    serve_cli,
    dashboard_cli,
    gateway_cli,
    runner_cli,
    train_cli,
    demo_cli,
    doctor_cli,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fulgor", description="Train existing AI agents from their rollouts."
    )
    parser.add_argument("--version", action="version", version=f"fulgor {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a command may run itself again (torchrun)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    result: int = handler(args)
    return result


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
