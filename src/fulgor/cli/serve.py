"""``fulgor serve``: the server (store API, OTLP span ingestion, with ``--upstream`` the gateway) over HTTP.

Prints ``http://HOST:PORT`` as the first line of stdout once the port is bound (the real port with
``--port 0``), serves until SIGINT or SIGTERM, then closes the store and releases the port.

The bearer token comes from ``--token-file`` or else the ``FULGOR_TOKEN`` environment variable;
without one the server only binds to loopback addresses.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.cli._options import port_number
from fulgor.cli.gateway import add_upstream_arguments, build_gateway, close_store
from fulgor.errors import ConfigError, FulgorError
from fulgor.store.client import TOKEN_ENV

if TYPE_CHECKING:
    from fulgor.dashboard import Dashboard
    from fulgor.store.base import Store

DEFAULT_STORE = "sqlite:///runs/default/store.sqlite"
NO_OPERATOR_KEY = (
    "warning: no operator key (--token-file or FULGOR_TOKEN): every process on this machine can use "
    "the store API and every rollout's gateway URL, agents included; start with one to keep each "
    "agent to its own attempt"
)
DEFAULT_PORT = 8474


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve the store API, OTLP span ingestion and the dashboard over HTTP"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"store URL (default {DEFAULT_STORE})")
    parser.add_argument(
        "--token-file",
        type=Path,
        help=f"file holding the bearer token clients must send (else ${TOKEN_ENV}; needed off loopback)",
    )
    add_upstream_arguments(parser, required=False)
    parser.set_defaults(handler=_serve)


def resolve_token(token_file: Path | None) -> str | None:
    """The token from ``--token-file``, else ``$FULGOR_TOKEN``, else None."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as error:
            raise ConfigError(f"cannot read --token-file {token_file}: {error.strerror}") from None
        if not token:
            raise ConfigError(f"--token-file {token_file} is empty; write the token into it")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def serve_dashboard(store: Store, token: str | None) -> Dashboard:
    """The dashboard over ``store``; a SQLite store's folder is its run folder (metrics, run.json)."""
    from fulgor.dashboard import Dashboard, open_reader
    from fulgor.store.sqlite import SqliteStore

    run_dirs = [store.path.parent] if isinstance(store, SqliteStore) else []
    return Dashboard(open_reader(store), run_dirs=run_dirs, token=token)


def _serve(args: argparse.Namespace) -> int:
    try:
        from fulgor import server
        from fulgor.net.asgi import serve_forever
        from fulgor.net.sockets import bind_socket, url_of
        from fulgor.store.sync import open_store

        token = resolve_token(args.token_file)
        server.check_bind(args.host, token)
        if args.store.startswith(("http://", "https://")):
            raise ConfigError(
                "--store must be a store this process opens (sqlite:///PATH, postgresql://... or "
                "memory://), not another fulgor server"
            )
        store = open_store(args.store)
        try:
            gateway = build_gateway(args, store, token) if args.upstream else None
            dashboard = serve_dashboard(store, token)
            app = server.create_app(
                server.ServerConfig(store=store, gateway=gateway, pages=dashboard, token=token)
            )
            sock = bind_socket(args.host, args.port)
        except BaseException:
            close_store(store)
            raise
    except (FulgorError, ImportError) as error:
        print(f"error: {getattr(error, 'message', error)}", file=sys.stderr)
        return 2
    print(url_of(sock), flush=True)
    if token is None:
        print(NO_OPERATOR_KEY, file=sys.stderr, flush=True)
    try:
        serve_forever(app, sock, access_log=args.verbose, on_shutdown=app.draining.begin)
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    return 0
