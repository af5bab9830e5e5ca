"""The store over HTTP: an ASGI app exposing every Store operation under ``/api/v1``.

``create_app(ServerConfig(store=...))`` builds a FastAPI app with the store routes, OTLP/HTTP span
ingestion at ``/v1/traces``, ``/healthz`` and the OpenAPI spec at ``/openapi.json``; other routers
(the gateway) are mounted into the same app with ``extra_routers``. ``serve_forever`` runs it with
uvicorn for ``fulgor serve``; :class:`BackgroundServer` runs it on a thread inside another program.

The store routes (:mod:`fulgor.store._store_api`) are lean on purpose: they are served ahead of
the framework's router, read the raw body, validate it with ``model_validate_json`` and return
JSON bytes serialised once. The app owns the store it is given and closes it on shutdown.
Requires the ``server`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from fulgor.errors import ConfigError, FulgorError
from fulgor.store import _api as api

try:
    import uvicorn
    from fastapi import APIRouter, FastAPI
    from fastapi.openapi.utils import get_openapi
    from fastapi.routing import APIRoute
    from pydantic import BaseModel, TypeAdapter
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Match, Route
    from starlette.types import ASGIApp, Receive, Scope, Send
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"the fulgor server needs FastAPI and uvicorn ({error.name} is missing): pip install 'fulgor[server]'"
    ) from error

from fulgor import __version__
from fulgor.store import _serving as serving
from fulgor.store import _store_api as store_api
from fulgor.store._serving import ServerConfig

if TYPE_CHECKING:
    from fulgor.gateway import Gateway

__all__ = [
    "BackgroundServer",
    "ServerConfig",
    "bind_socket",
    "check_bind",
    "create_app",
    "serve_forever",
    "url_of",
]

logger = logging.getLogger(__name__)


def _health_router() -> APIRouter:
    router = APIRouter(tags=["health"])
    body = api.Health(version=__version__).model_dump_json().encode()

    async def healthz() -> Response:
        return Response(body, media_type=serving.JSON)

    router.add_api_route(
        "/healthz",
        healthz,
        methods=["GET"],
        name="healthz",
        operation_id="healthz",
        summary="Liveness check (no token needed)",
        openapi_extra={
            "responses": {"200": store_api.json_content("Server is up", store_api.ref(api.Health))}
        },
    )
    return router


def create_app(
    config: ServerConfig, *, extra_routers: Sequence[APIRouter] = (), gateway: Gateway | None = None
) -> FastAPI:
    """The store server as an ASGI app; ``extra_routers`` are mounted beside the store routes.

    With a ``gateway``, its URLs (``/r/...`` and ``/gateway/...``) are served by the same process:
    they go straight to the gateway, which checks the run's key itself (as a bearer token or, for
    Anthropic clients, ``x-api-key``), and the lifespan starts and closes it with the store.
    """
    from fulgor.store.otlp import otlp_router

    state = serving.ServerState(config, serving.IdempotencyCache(config.idempotency_entries))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if gateway is not None:
            await gateway.start()
        try:
            yield
        finally:
            if gateway is not None:
                await gateway.close()
            await config.store.close()

    app = FastAPI(title="fulgor", version=__version__, lifespan=lifespan, redoc_url=None)
    app.state.fulgor = state
    for router in (_health_router(), otlp_router(), *extra_routers):
        app.include_router(router)
    _install_error_handlers(app)
    # Added last runs first: auth, then the body limit, then the store routes, then everything else.
    app.add_middleware(store_api.StoreAPI, state=state)
    app.add_middleware(serving.BodyLimitMiddleware, max_body_bytes=config.max_body_bytes)
    if config.token is not None:
        app.add_middleware(serving.AuthMiddleware, token=config.token)
    if gateway is not None:
        app.add_middleware(_GatewayRoutes, gateway=gateway)
    app.openapi = lambda: _openapi(app, secured=config.token is not None)  # type: ignore[method-assign]
    return app


class _GatewayRoutes:
    """Hands the gateway's paths to the gateway before the store's auth, limits and routes."""

    PREFIXES = ("/r/", "/gateway/")

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.PREFIXES):
            await self.gateway(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _install_error_handlers(app: FastAPI) -> None:
    async def fulgor_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, FulgorError)
        return serving.fulgor_error_response(error)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        code = {404: "route_not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        message = f"{request.method} {request.url.path}: {error.detail}; see /openapi.json for the routes"
        headers = dict(error.headers or {})
        if error.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return serving.error_response(error.status_code, code, message, headers=headers)

    async def internal_error(request: Request, error: Exception) -> Response:
        logger.exception("%s %s failed", request.method, request.url.path, exc_info=error)
        return serving.error_response(500, "internal_error", "the server failed; see its log for details")

    app.add_exception_handler(FulgorError, fulgor_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route serves at this path (one path may have several routes)."""
    methods: set[str] = set()
    for route in app.routes:
        if isinstance(route, Route | APIRoute) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return sorted(methods)


# -- OpenAPI ----------------------------------------------------------------------------------------


def _component_schemas() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """All component schemas, and each store route's 200 schema, from one consistent generation."""
    inputs: list[tuple[Any, Any, TypeAdapter[Any]]] = [
        (route.name, "serialization", route.response) for route in store_api.ROUTES
    ]
    models: list[type[BaseModel]] = [r.body for r in store_api.ROUTES if r.body is not None]
    models += [api.ErrorBody, api.Health]
    for model in models:
        inputs.append((model.__name__, "validation", TypeAdapter(model)))
    keyed, top = TypeAdapter.json_schemas(inputs, ref_template=store_api.SCHEMA_REF)
    responses = {key: schema for (key, mode), schema in keyed.items() if mode == "serialization"}
    return dict(top.get("$defs", {})), responses


def _openapi(app: FastAPI, *, secured: bool) -> dict[str, Any]:
    """The framework's spec for its routes, plus the store routes and every component schema."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components, responses = _component_schemas()
    schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
    schema["paths"].update(store_api.openapi_paths(responses))
    if secured:
        for path_item in schema["paths"].values():
            for operation in path_item.values():
                if operation.get("operationId") != "healthz":
                    operation["security"] = [{"bearer": []}]
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    app.openapi_schema = schema
    return schema


# -- running ----------------------------------------------------------------------------------------


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token (anyone reaching it could use the store)."""
    if token is not None or _is_loopback(host):
        return
    raise ConfigError(
        f"refusing to serve on {host} without a token: anyone who can reach that address could read and "
        "change the store. Set one with --token-file FILE (a file holding the token) or the FULGOR_TOKEN "
        "environment variable, e.g. export FULGOR_TOKEN=$(python -c 'import secrets; "
        "print(secrets.token_urlsafe(32))'), and give clients the same token; or serve on 127.0.0.1"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one); a clear ConfigError when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use: stop the process holding it "
                f"(find it with `lsof -i :{port}` or `ss -ltnp 'sport = :{port}'`), or choose another port "
                "with --port P (--port 0 picks a free one)"
            ) from None
        raise ConfigError(
            f"cannot listen on {host}:{port}: {error.strerror}; check --host and --port"
        ) from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket, with the real port."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, draining long-polls as soon as shutdown begins."""

    def __init__(self, config: uvicorn.Config, draining: serving.Draining) -> None:
        super().__init__(config)
        self._draining = draining

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._draining.begin()
        super().handle_exit(sig, frame)


def _uvicorn_server(app: FastAPI, *, access_log: bool) -> _Server:
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=access_log,
        lifespan="on",
        timeout_keep_alive=75,
        timeout_graceful_shutdown=5,
    )
    return _Server(config, app.state.fulgor.draining)


def serve_forever(app: FastAPI, sock: socket.socket, *, access_log: bool = False) -> None:
    """Serve until SIGINT or SIGTERM, then shut down cleanly: long-polls answered, store closed."""
    server = _uvicorn_server(app, access_log=access_log)
    # uvicorn re-raises the signal after a graceful shutdown; quiet handlers make that a normal return.
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


def _ignore(sig: int, frame: Any) -> None:
    logger.debug("signal %s after shutdown ignored", sig)


class BackgroundServer:
    """Serves an app on its own thread and event loop, e.g. inside a trainer or a test.

    ``start()`` returns the URL once the server accepts requests; ``stop()`` shuts it down
    (long-polls answered, store closed) and releases the port.
    """

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0) -> None:
        check_bind(host, app.state.fulgor.config.token)
        self.app = app
        self._sock = bind_socket(host, port)
        self.url = url_of(self._sock)
        self._server = _uvicorn_server(app, access_log=False)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="fulgor-server", daemon=True
        )

    def start(self, timeout_seconds: float = 30.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout_seconds
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"the server at {self.url} did not start; see the log for why")
            time.sleep(0.002)
        return self.url

    def stop(self) -> None:
        self.app.state.fulgor.draining.begin()
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    async def astop(self) -> None:
        """:meth:`stop` without blocking the caller's event loop."""
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> BackgroundServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
