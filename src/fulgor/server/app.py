"""The server app: one ASGI app for the store API, OTLP span ingestion and the gateway.

``create_app(ServerConfig(store=..., gateway=...))`` builds it from one routing table
(:mod:`fulgor.server.routing`): the gateway's URLs (``/r/...``, ``/gateway/...``) mounted as they
are, then the store's operations under ``/api/v1``, ``POST /v1/traces``, ``GET /healthz`` and the
spec at ``GET /openapi.json``. Its lifespan starts the gateway and, on shutdown, closes the gateway
(which writes what it still holds) and then the store. ``fulgor serve`` runs it with
:func:`fulgor.net.asgi.serve_forever`; :class:`BackgroundServer` runs it on a thread inside another
program. Serving needs the ``server`` extra (uvicorn); building the app needs no web framework.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from fulgor.errors import ConfigError
from fulgor.net.asgi import ServerThread
from fulgor.net.request_body import timed_receive
from fulgor.net.sockets import is_loopback
from fulgor.server.config import ServerConfig
from fulgor.server.draining import Draining
from fulgor.server.http import Answer, ASGIApp, Receive, Scope, Send
from fulgor.server.openapi import build_spec, json_content, ref
from fulgor.server.otlp import otlp_route
from fulgor.server.rewards import reward_route
from fulgor.server.routing import Mount, Route, Router
from fulgor.server.store_api import StoreState, store_routes
from fulgor.store import http_api as api
from fulgor.version import __version__

__all__ = ["App", "BackgroundServer", "check_bind", "create_app", "health_route"]

logger = logging.getLogger(__name__)

GATEWAY_PREFIXES = ("/r/", "/gateway/")


def create_app(config: ServerConfig) -> App:
    """The server as an ASGI app; see the module docstring."""
    draining = Draining()
    routes = [
        *store_routes(StoreState(config, draining)),
        otlp_route(config.store, config.max_body_bytes, config.token),
        health_route(),
    ]
    secured = config.token is not None
    if config.token is not None:
        routes.append(reward_route(config.store, config.token))
    routes.append(_spec_route(tuple(routes), secured=secured))
    if config.pages is not None:
        routes += config.pages.routes()
    mounts = [Mount(prefix, config.gateway) for prefix in GATEWAY_PREFIXES] if config.gateway else []
    router = Router(routes, mounts, token=config.token, max_body_bytes=config.max_body_bytes)
    return App(config, router, draining)


class App:
    """The ASGI app :func:`create_app` builds: HTTP to its router, lifespan to its services.

    ``draining.begin()`` (called as soon as shutdown begins) answers held long-polls at once.
    """

    def __init__(self, config: ServerConfig, router: Router, draining: Draining) -> None:
        self.config = config
        self.router = router
        self.draining = draining
        self._handler: ASGIApp = self._serve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handler(scope, receive, send)

    def add_middleware(self, middleware: Callable[..., ASGIApp], *args: Any, **kwargs: Any) -> None:
        """Wrap the whole app (every request, the store's included) in ``middleware(app, ...)``."""
        self._handler = middleware(self._handler, *args, **kwargs)

    def openapi(self) -> dict[str, Any]:
        """The OpenAPI document of every route that documents itself."""
        return _spec(self.router.routes, secured=self.config.token is not None)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # Every route's body, the mounted gateway's included, must keep coming or get a 408.
            await self.router(scope, timed_receive(receive, self.config.body_timeout_seconds), send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        gateway = self.config.gateway
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if gateway is not None:
                        await gateway.start()
                except Exception as error:  # the server's boundary: uvicorn reports it and exits
                    logger.exception("the server could not start")
                    await send({"type": "lifespan.startup.failed", "message": str(error)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    if gateway is not None:
                        await gateway.close()
                finally:
                    if self.config.pages is not None:
                        await self.config.pages.close()
                    if self.config.close_store:
                        await self.config.store.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _spec(routes: Sequence[Route], *, secured: bool) -> dict[str, Any]:
    return build_spec(routes, title="fulgor", version=__version__, secured=secured)


def _spec_route(routes: Sequence[Route], *, secured: bool) -> Route:
    """``GET /openapi.json``: the spec of ``routes``, built on the first request."""
    built: list[bytes] = []

    async def openapi(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        if not built:
            built.append(json.dumps(_spec(routes, secured=secured)).encode())
        return Answer(200, built[0])

    return Route("GET", "/openapi.json", openapi, open=True)


def health_route() -> Route:
    body = api.Health(version=__version__).model_dump_json().encode()

    async def healthz(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        return Answer(200, body)

    operation = {
        "tags": ["health"],
        "summary": "Liveness check (no token needed)",
        "operationId": "healthz",
        "responses": {"200": json_content("Server is up", ref(api.Health))},
    }
    return Route("GET", "/healthz", healthz, open=True, operation=operation)


# -- running ----------------------------------------------------------------------------------------


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token (anyone reaching it could use the store)."""
    if token is not None or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to serve on {host} without a token: anyone who can reach that address could read and "
        "change the store. Set one with --token-file FILE (a file holding the token) or the FULGOR_TOKEN "
        "environment variable, e.g. export FULGOR_TOKEN=$(python -c 'import secrets; "
        "print(secrets.token_urlsafe(32))'), and give clients the same token; or serve on 127.0.0.1"
    )


class BackgroundServer(ServerThread):
    """The server on its own thread and event loop, e.g. inside a trainer or a test.

    It refuses a non-loopback ``host`` without a token (:func:`check_bind`); ``stop()`` answers held
    long-polls at once, then closes the gateway and the store and releases the port.
    """

    def __init__(self, app: App, *, host: str = "127.0.0.1", port: int = 0) -> None:
        check_bind(host, app.config.token)
        super().__init__(app, host=host, port=port, on_shutdown=app.draining.begin)
