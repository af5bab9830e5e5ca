"""``fulgor store``: look inside a store file without writing code.

``fulgor store stats --store URL`` prints counts; ``fulgor store rollouts`` lists rollouts;
``fulgor store spans ROLLOUT_ID`` prints a rollout's spans. Output is JSON, one object per line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, get_args

from fulgor.errors import FulgorError
from fulgor.store.base import Store
from fulgor.store.sync import open_store
from fulgor.types import RolloutStatus

DEFAULT_STORE = "sqlite:///runs/default/store.sqlite"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("store", help="inspect a store: stats, rollouts, spans")
    commands = parser.add_subparsers(dest="store_command", metavar="STORE_COMMAND", required=True)

    stats = commands.add_parser("stats", help="counts of rollouts and attempts per status, spans, workers")
    _add_store_flag(stats)
    stats.set_defaults(handler=lambda args: _run(args, _stats))

    rollouts = commands.add_parser("rollouts", help="list rollouts, oldest first")
    _add_store_flag(rollouts)
    rollouts.add_argument(
        "--status", action="append", choices=get_args(RolloutStatus), help="only this status (repeatable)"
    )
    rollouts.add_argument("--group-id", help="only rollouts of this group")
    rollouts.add_argument("--limit", type=int, default=50)
    rollouts.set_defaults(handler=lambda args: _run(args, _rollouts))

    spans = commands.add_parser("spans", help="spans of one rollout, in order")
    _add_store_flag(spans)
    spans.add_argument("rollout_id")
    spans.add_argument("--attempt", default=None, help="an attempt id, or 'latest' (default: all attempts)")
    spans.set_defaults(handler=lambda args: _run(args, _spans))


def _add_store_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"store URL (default {DEFAULT_STORE})")


def _run(args: argparse.Namespace, command: Any) -> int:
    try:
        store = open_store(args.store, create=False)
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2

    async def run() -> int:
        try:
            lines: list[str] = await command(store, args)
        except FulgorError as error:
            print(f"error: {error.message}", file=sys.stderr)
            return 1
        finally:
            await store.close()
        for line in lines:
            print(line)
        return 0

    return asyncio.run(run())


async def _stats(store: Store, args: argparse.Namespace) -> list[str]:
    return [(await store.stats()).model_dump_json()]


async def _rollouts(store: Store, args: argparse.Namespace) -> list[str]:
    rollouts = await store.query_rollouts(status=args.status, group_id=args.group_id, limit=args.limit)
    return [rollout.model_dump_json() for rollout in rollouts]


async def _spans(store: Store, args: argparse.Namespace) -> list[str]:
    return [span.model_dump_json() for span in await store.query_spans(args.rollout_id, args.attempt)]
