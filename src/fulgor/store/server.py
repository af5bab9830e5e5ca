"""The store over HTTP: an ASGI app exposing every Store operation under ``/api/v1``.

``create_app(ServerConfig(store=...))`` builds a FastAPI app with the store routes, OTLP/HTTP span
ingestion at ``/v1/traces``, ``/healthz`` and the OpenAPI spec at ``/openapi.json``; other routers
(the gateway) are mounted into the same app with ``extra_routers``. ``fulgor serve`` runs it with
:func:`fulgor.net.asgi.serve_forever`; :class:`BackgroundServer` runs it on a thread inside another
program.

The store routes (:mod:`fulgor.store._store_api`) are lean on purpose: they are served ahead of
the framework's middleware and router (with the same auth and body limit), read the raw body,
validate it with ``model_validate_json`` and return JSON bytes serialised once. The app owns the
store it is given and closes it on shutdown. Requires the ``server`` extra.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from fulgor.errors import ConfigError, FulgorError
from fulgor.store import _api as api

try:
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
from fulgor.net.asgi import ServerThread
from fulgor.net.sockets import is_loopback
from fulgor.store import _serving as serving
from fulgor.store import _store_api as store_api
from fulgor.store._serving import ServerConfig

if TYPE_CHECKING:
    from fulgor.gateway import Gateway

__all__ = ["BackgroundServer", "ServerConfig", "check_bind", "create_app"]

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

    app = _App(title="fulgor", version=__version__, lifespan=lifespan, redoc_url=None)
    app.state.fulgor = state
    for router in (_health_router(), otlp_router(), *extra_routers):
        app.include_router(router)
    _install_error_handlers(app)
    # Added last runs first: the gateway's paths, auth, then the body limit, then everything else.
    app.add_middleware(serving.BodyLimitMiddleware, max_body_bytes=config.max_body_bytes)
    if config.token is not None:
        app.add_middleware(serving.AuthMiddleware, token=config.token)
    if gateway is not None:
        app.add_middleware(_GatewayRoutes, gateway=gateway)
    # The store's own paths take the same auth and body limit, without the framework around them.
    front: ASGIApp = store_api.StoreAPI(state)
    front = serving.BodyLimitMiddleware(front, max_body_bytes=config.max_body_bytes)
    if config.token is not None:
        front = serving.AuthMiddleware(front, token=config.token)
    app.store_routes = front
    app.openapi = lambda: _openapi(app, secured=config.token is not None)  # type: ignore[method-assign]
    return app


class _App(FastAPI):
    """FastAPI, with the store's paths (``/api/v1/...``) answered before the framework's stack.

    A store call is a few tens of microseconds; the framework's layers around a route (its
    middleware stack, exception handling, request and response objects) cost more than the call, so
    ``store_routes`` (auth, body limit and :class:`~fulgor.store._store_api.StoreAPI`, the same
    checks the other routes get as middleware) sees those paths first. Middleware added to the app
    later wraps the store's paths too, so it still sees every request.
    """

    store_routes: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.store_routes is not None
            and scope["type"] == "http"
            and scope["path"].startswith(store_api.PATH_PREFIX)
        ):
            await self.store_routes(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None:
        super().add_middleware(middleware_class, *args, **kwargs)
        if self.store_routes is not None:
            self.store_routes = middleware_class(self.store_routes, *args, **kwargs)


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
        return serving.fulgor_error_answer(error).response()

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        code = {404: "route_not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        message = f"{request.method} {request.url.path}: {error.detail}; see /openapi.json for the routes"
        headers = dict(error.headers or {})
        if error.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return serving.error_answer(error.status_code, code, message, headers=headers).response()

    async def internal_error(request: Request, error: Exception) -> Response:
        logger.exception("%s %s failed", request.method, request.url.path, exc_info=error)
        return serving.internal_error_answer().response()

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
    if token is not None or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to serve on {host} without a token: anyone who can reach that address could read and "
        "change the store. Set one with --token-file FILE (a file holding the token) or the FULGOR_TOKEN "
        "environment variable, e.g. export FULGOR_TOKEN=$(python -c 'import secrets; "
        "print(secrets.token_urlsafe(32))'), and give clients the same token; or serve on 127.0.0.1"
    )


class BackgroundServer(ServerThread):
    """The store server on its own thread and event loop, e.g. inside a trainer or a test.

    It refuses a non-loopback ``host`` without a token (:func:`check_bind`); ``stop()`` answers held
    long-polls at once, then closes the store and releases the port.
    """

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0) -> None:
        check_bind(host, app.state.fulgor.config.token)
        super().__init__(app, host=host, port=port, on_shutdown=app.state.fulgor.draining.begin)
