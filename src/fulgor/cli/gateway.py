"""``fulgor gateway``: the model-call gateway on its own, in front of one or more engine replicas.

``fulgor gateway --store http://HOST:PORT --upstream http://127.0.0.1:8000/v1 [--upstream ...]``
prints ``http://HOST:PORT`` once the port is bound; agents then use
``http://HOST:PORT/r/{rollout_id}/{attempt_id}/v1`` as their OpenAI base URL. The run's key comes
from ``--token-file`` or ``$FULGOR_TOKEN``; without one the gateway binds to loopback only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fulgor.cli._options import non_negative_int, port_number
from fulgor.errors import ConfigError, FulgorError

DEFAULT_PORT = 8475


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gateway", help="serve per-rollout OpenAI/Anthropic URLs that record model calls"
    )
    parser.add_argument(
        "--store", required=True, help="store URL: http://HOST:PORT of fulgor serve, or sqlite:///PATH"
    )
    add_upstream_arguments(parser, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = free)"
    )
    parser.add_argument("--token-file", type=Path, help="file holding the run's key (else $FULGOR_TOKEN)")
    parser.set_defaults(handler=_run)


def add_upstream_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The gateway's flags, shared by ``fulgor gateway`` and ``fulgor serve``."""
    parser.add_argument(
        "--upstream",
        action="append",
        required=required,
        help="engine base URL ending in /v1 (repeat for replicas)"
        + ("" if required else "; serves the gateway at /r/{rollout_id}/{attempt_id}/v1 in this process"),
    )
    parser.add_argument("--upstream-api-key", help="API key sent to the upstreams (not the agents' key)")
    parser.add_argument(
        "--no-token-ids",
        action="store_true",
        help="do not ask upstreams for token ids (APIs that reject vLLM fields); calls are flagged",
    )
    parser.add_argument(
        "--model-map",
        action="append",
        type=_model_map_entry,
        default=[],
        metavar="NAME=MODEL",
        help="serve calls that name NAME with MODEL (repeat); other calls get the model their "
        "rollout's resources name, whatever model the agent sends",
    )
    parser.add_argument(
        "--model-version",
        type=non_negative_int,
        help="the weights version (a whole number) recorded on calls whose upstream names none",
    )


def build_gateway(args: argparse.Namespace, store: Any, key: str | None) -> Any:
    """A Gateway over ``store`` from the flags of :func:`add_upstream_arguments`; each upstream is
    asked for its models first (ConfigError for a URL that is no OpenAI base URL)."""
    import asyncio

    from fulgor.gateway import GatewayConfig, Upstream, create_gateway_app
    from fulgor.gateway.upstreams import check_upstreams

    upstreams = [
        Upstream(url, api_key=args.upstream_api_key, request_token_ids=not args.no_token_ids)
        for url in args.upstream
    ]
    upstreams = asyncio.run(check_upstreams(upstreams))
    config = GatewayConfig(api_key=key, model_version=args.model_version, model_map=dict(args.model_map))
    return create_gateway_app(store, upstreams, config)


def _model_map_entry(text: str) -> tuple[str, str]:
    name, equals, model = text.partition("=")
    if not equals or not name or not model:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=MODEL, e.g. gpt-4.1-mini=small")
    return name, model


def _run(args: argparse.Namespace) -> int:
    try:
        from fulgor.cli.serve import NO_OPERATOR_KEY, resolve_token
        from fulgor.net.asgi import serve_forever
        from fulgor.net.sockets import bind_socket, is_loopback, url_of
        from fulgor.store.sync import open_store

        key = resolve_token(args.token_file)
        if key is None and not is_loopback(args.host):
            raise ConfigError(
                f"binding to {args.host} needs the run's key: pass --token-file or set FULGOR_TOKEN"
            )
        store = open_store(args.store)
        try:
            app = _closing_store(build_gateway(args, store, key), store)
            sock = bind_socket(args.host, args.port)
        except BaseException:
            close_store(store)
            raise
    except (FulgorError, ImportError) as error:
        print(f"error: {getattr(error, 'message', error)}", file=sys.stderr)
        return 2
    print(url_of(sock), flush=True)
    if key is None:
        print(NO_OPERATOR_KEY, file=sys.stderr, flush=True)
    try:
        serve_forever(app, sock, access_log=args.verbose)
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    return 0


def _closing_store(app: Any, store: Any) -> Any:
    """``app``, whose lifespan shutdown also closes ``store`` (on the server's event loop, which owns
    the store's connections), once the gateway has written what it still held."""

    async def closing(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_after_close(message: Any) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await store.close()
            await send(message)

        await app(scope, receive, send_after_close)

    return closing


def close_store(store: Any) -> None:
    """Close a store opened by a CLI command that fails before serving it."""
    import asyncio

    asyncio.run(store.close())
