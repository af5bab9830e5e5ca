"""The server's one routing table: routes (method + path template → endpoint) and mounts (prefix → app).

A :class:`Mount` hands every request under its prefix, unchanged, to another ASGI app that does its
own checks (the gateway: it takes the run's key as a bearer token or as Anthropic's ``x-api-key``).
A :class:`Route` answers one method on one path; its endpoint gets the path parameters and returns
a whole :class:`~fulgor.server.http.Answer`. Every route but the open ones (health, the spec) needs
the server's bearer token when it has one, and every body is held to the server's size limit.
Fulgor and pydantic errors become their 4xx answers, anything else a logged 500; an unknown path is
a 404 and a known path with another method a 405 that lists the allowed ones.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from fulgor.server.http import (
    Answer,
    ASGIApp,
    Receive,
    Scope,
    Send,
    check_token,
    declared_too_large,
    error_answer,
    guarded,
    internal_error_answer,
)

__all__ = ["Endpoint", "Mount", "Route", "Router"]

logger = logging.getLogger(__name__)

Endpoint = Callable[[Scope, Receive, dict[str, str]], Awaitable[Answer]]

# A percent-encoded slash inside an id must not split its path segment; it travels as this
# character while routing, and turns back into "/" in the path parameters.
_SLASH = "\u2215"


@dataclass(frozen=True)
class Route:
    """``method`` on ``path`` (``{name}`` marks a path parameter, any text but a slash).

    ``open`` routes are served without the server's token; ``scoped`` routes take an attempt's
    credential as well as the server's token, and check which one they got themselves (OTLP
    export: an agent writes into its own attempt only); ``operation`` is the route's OpenAPI
    operation object, when it documents itself.
    """

    method: str
    path: str
    endpoint: Endpoint
    open: bool = False
    scoped: bool = False
    operation: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Mount:
    """Every path that starts with ``prefix`` goes to ``app`` as it came."""

    prefix: str
    app: ASGIApp


class Router:
    """Dispatches HTTP requests to mounts, then routes; see the module docstring."""

    def __init__(
        self,
        routes: Sequence[Route],
        mounts: Sequence[Mount] = (),
        *,
        token: str | None,
        max_body_bytes: int,
    ) -> None:
        self.routes = tuple(routes)
        self._mounts = tuple((mount.prefix, mount.app) for mount in mounts)
        self._expected = None if token is None else f"Bearer {token}".encode()
        self._max_body_bytes = max_body_bytes
        # Literal paths are looked up at once; templates are tried in order after them, so a
        # literal path (/rollouts/start) is never read as a parameter (/rollouts/{rollout_id}).
        self._literal: dict[str, dict[str, Route]] = {}
        self._templates: list[tuple[re.Pattern[str], dict[str, Route]]] = []
        patterns: dict[str, dict[str, Route]] = {}
        for route in self.routes:
            table = self._literal if "{" not in route.path else patterns
            methods = table.setdefault(route.path, {})
            if route.method in methods:
                raise ValueError(f"two routes for {route.method} {route.path}")
            methods[route.method] = route
        # An empty parameter is still one: the store answers an empty id (not_found) as it does locally.
        self._templates = [
            (re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]*)", path)), methods)
            for path, methods in patterns.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        for prefix, app in self._mounts:
            if path.startswith(prefix):
                await app(scope, receive, send)
                return
        await (await self._answer(scope, receive)).send(send)

    async def _answer(self, scope: Scope, receive: Receive) -> Answer:
        path = _routing_path(scope)
        methods, params = self._match(path)
        route = None if methods is None else methods.get(scope["method"])
        open_path = methods is not None and any(r.open or r.scoped for r in methods.values())
        if self._expected is not None and not open_path:
            refused = check_token(scope, self._expected)
            if refused is not None:
                return refused
        too_large = declared_too_large(scope, self._max_body_bytes)
        if too_large is not None:
            return too_large
        where = f"{scope['method']} {scope['path']}"
        if methods is None:
            return error_answer(404, "route_not_found", f"{where}: no such route; see /openapi.json")
        if route is None:
            allowed = list(methods)
            message = f"{where}: use {' or '.join(allowed)}; see /openapi.json"
            return error_answer(405, "method_not_allowed", message, headers={"Allow": ", ".join(allowed)})
        try:
            return await guarded(lambda: route.endpoint(scope, receive, params))
        except Exception:
            logger.exception("%s failed", where)
            return internal_error_answer()

    def _match(self, path: str) -> tuple[dict[str, Route] | None, dict[str, str]]:
        """The routes of ``path`` by method, and its path parameters."""
        methods = self._literal.get(path)
        if methods is not None:
            return methods, {}
        for pattern, methods in self._templates:
            match = pattern.fullmatch(path)
            if match is not None:
                return methods, {k: v.replace(_SLASH, "/") for k, v in match.groupdict().items()}
        return None, {}


def _routing_path(scope: Scope) -> str:
    """The request path with percent-encoded slashes kept inside their segment."""
    path: str = scope["path"]
    raw = scope.get("raw_path") or b""
    if b"%2f" not in raw.lower():
        return path
    segments = raw.decode("ascii", "replace").split("?")[0].split("/")
    return "/".join(unquote(segment).replace("/", _SLASH) for segment in segments)
