"""``fulgor dashboard RUN_DIR``: the dashboard, read-only, over a run's SQLite store and metrics.

``RUN_DIR`` is a Trainer's run folder (``store.sqlite`` and ``metrics.jsonl``) or a store file.
Prints ``http://HOST:PORT`` as the first line of stdout once the port is bound, serves until
SIGINT or SIGTERM. Off loopback it needs a token (``--token-file`` or ``FULGOR_TOKEN``), which the
browser gives once through the sign-in form.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fulgor.cli._options import port_number
from fulgor.cli.serve import resolve_token
from fulgor.errors import ConfigError, FulgorError
from fulgor.store.client import TOKEN_ENV

DEFAULT_PORT = 8475
STORE_FILE = "store.sqlite"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="show a run (its store and metrics) in a browser, read-only"
    )
    parser.add_argument("run_dir", type=Path, help=f"a run folder (holding {STORE_FILE}) or a store file")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks one)"
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        help=f"file holding the token a browser must give (else ${TOKEN_ENV}; needed off loopback)",
    )
    parser.add_argument(
        "--tokenizer", type=Path, help="a model or tokenizer folder for the token view's text"
    )
    parser.set_defaults(handler=_dashboard)


def store_path(run_dir: Path) -> Path:
    """The store file of ``run_dir`` (itself, when it is a file); ConfigError naming what to pass."""
    if run_dir.is_file():
        return run_dir
    if (run_dir / STORE_FILE).is_file():
        return run_dir / STORE_FILE
    below = sorted(str(path.parent) for path in run_dir.glob(f"*/{STORE_FILE}")) if run_dir.is_dir() else []
    hint = f"; runs below it: {', '.join(below)}" if below else ""
    raise ConfigError(f"{run_dir} holds no {STORE_FILE}: name a run folder or a store file{hint}")


def _dashboard(args: argparse.Namespace) -> int:
    try:
        from fulgor import server
        from fulgor.dashboard import Dashboard, SqliteReader
        from fulgor.dashboard.app import DashboardApp
        from fulgor.net.asgi import serve_forever
        from fulgor.net.sockets import bind_socket, url_of

        token = resolve_token(args.token_file)
        server.check_bind(args.host, token)
        path = store_path(args.run_dir)
        reader = SqliteReader(path)
        dashboard = Dashboard(reader, run_dirs=[path.parent], token=token, tokenizer=args.tokenizer)
        try:
            sock = bind_socket(args.host, args.port)
        except BaseException:
            import asyncio

            asyncio.run(reader.close())
            raise
    except (FulgorError, ImportError) as error:
        print(f"error: {getattr(error, 'message', error)}", file=sys.stderr)
        return 2
    print(url_of(sock), flush=True)
    try:
        serve_forever(DashboardApp(dashboard), sock, access_log=args.verbose)
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    return 0
