"""``fulgor runner``: run an agent's rollouts from a store in a pool of worker processes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from fulgor.errors import FulgorError
from fulgor.store.client import TOKEN_ENV


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "runner",
        help="run an agent's rollouts from a store in worker processes",
        description="Claims rollouts from the store and runs the agent on them until Ctrl+C. "
        "The first Ctrl+C drains (running rollouts get --grace-seconds), the second stops at once.",
    )
    parser.add_argument(
        "--agent", required=True, help="the agent as module:object (a @rollout function or an Agent)"
    )
    parser.add_argument(
        "--store",
        "--server",
        dest="store",
        default="sqlite:///runs/default/store.sqlite",
        help="a store every worker process can open: sqlite:///PATH or `fulgor serve`'s http://HOST:PORT",
    )
    parser.add_argument("--n-runners", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--max-concurrency", type=int, default=1, help="rollouts at once per worker")
    parser.add_argument("--gateway-url", help="hand agents per-rollout LLM URLs under this gateway")
    parser.add_argument(
        "--token-file",
        type=Path,
        help="file holding the run's operator key (else $FULGOR_TOKEN): the runners' store client "
        "sends it, and each agent gets a credential derived from it for its own attempt only",
    )
    parser.add_argument("--grace-seconds", type=float, default=10.0, help="drain time on the first Ctrl+C")
    parser.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=5.0,
        help="heartbeat interval; keep it below the rollouts' unresponsive_seconds",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from fulgor.cli.serve import resolve_token
    from fulgor.runner.pool import PoolConfig, RunnerPool
    from fulgor.runner.worker import RunnerConfig

    try:
        operator_key = resolve_token(args.token_file) if args.token_file is not None else None
        if operator_key is not None:  # for the runners' store clients too, which read $FULGOR_TOKEN
            os.environ[TOKEN_ENV] = operator_key
        runner = RunnerConfig(
            max_concurrency=args.max_concurrency,
            gateway_url=args.gateway_url,
            operator_key=operator_key,
            shutdown_grace_seconds=args.grace_seconds,
            heartbeat_seconds=args.heartbeat_seconds,
        )
        pool = RunnerPool(args.agent, args.store, PoolConfig(n_runners=args.n_runners, runner=runner))
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    print(f"fulgor runner: {args.n_runners} worker(s) on {args.store}; Ctrl+C to stop", flush=True)
    if args.gateway_url is None:
        print(
            "warning: no --gateway-url: agents call their LLM resource's endpoint directly, so their "
            "model calls are not recorded for training; pass the gateway's URL (e.g. fulgor serve's, "
            "started with --upstream) to record them",
            file=sys.stderr,
        )
    return pool.run()
