"""``fulgor demo``: the calc demo (``examples.calc.train``), run from a fulgor source checkout.

The demo ships with the source, not with the installed package: run from the checkout's top
directory, ``fulgor demo`` imports ``examples.calc.train`` from there (as ``make demo`` does with
``python -m``) and passes ``--run-dir``, ``--seed`` and ``--steps`` on. Anywhere else it says so
(exit status 2); a demo that fails is one ``error:`` line and status 1, Ctrl+C status 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from fulgor.cli._options import positive_int
from fulgor.errors import FulgorError

__all__ = ["register"]

DEMO_MODULE = "examples.calc.train"
# The extras `make demo` installs.
DEMO_EXTRAS = "fulgor[torch,server,frameworks,report]"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the calc demo (from a fulgor source checkout)",
        description="Build a tiny model and train it with GRPO to use a calculator tool, on a CPU, through "
        "the real store, gateway, engine and runners (about five minutes). Run it from the top "
        "directory of a fulgor source checkout: the demo ships with the source.",
    )
    parser.add_argument("--run-dir", type=Path, metavar="DIR", help="default: runs/calc-<date>-<time>")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--steps", type=positive_int, default=150, help="GRPO steps (at most; it stops after 5 minutes)"
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    checkout = Path.cwd()
    if not (checkout / "examples" / "calc" / "train.py").is_file():
        print(
            f"error: the demo ships with fulgor's source checkout, and {checkout} is not one; run "
            "`make demo` or `fulgor demo` from the fulgor source directory",
            file=sys.stderr,
        )
        return 2
    try:
        demo = _import_demo(checkout)
    except ImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    argv = ["--seed", str(args.seed), "--steps", str(args.steps)]
    if args.run_dir is not None:
        argv += ["--run-dir", str(args.run_dir)]
    try:
        result: int = demo.main(argv)
    except (FulgorError, ImportError) as error:
        print(f"error: {getattr(error, 'message', error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        again = (
            f"run it again with --run-dir {args.run_dir} to continue from the stages it finished"
            if args.run_dir is not None
            else "run it again to start a new run (with --run-dir DIR a run can be continued)"
        )
        print(f"\ninterrupted: the demo stopped; {again}", file=sys.stderr)
        return 130
    return result


def _import_demo(checkout: Path) -> Any:
    """The checkout's ``examples.calc.train``, imported as ``python -m`` would (the checkout first)."""
    from fulgor.weights.loading import require_torch

    require_torch()
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        return importlib.import_module(DEMO_MODULE)
    except ImportError as error:
        raise ImportError(f"the demo needs {error.name or error}: pip install '{DEMO_EXTRAS}'") from error
