"""The store's routes: one small function per Store operation, and the dispatcher that serves them.

Every route lives under ``/api/v1``. :class:`StoreAPI` answers those paths itself, ahead of the web
framework's router and middleware (which cost several times more than a store call): it matches
the path against a short table, reads the raw body, validates it with ``model_validate_json``,
calls the store and sends JSON bytes serialised once, without request or response objects.
:func:`openapi_paths` describes the same table for the OpenAPI spec.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, TypeAdapter
from starlette.types import Receive, Scope, Send

from fulgor.errors import FulgorError
from fulgor.store import _api as api
from fulgor.store import _serving as serving
from fulgor.store.base import Store

__all__ = ["PATH_PREFIX", "ROUTES", "StoreAPI", "openapi_paths"]

logger = logging.getLogger(__name__)

PATH_PREFIX = api.PREFIX + "/"
_IDEMPOTENCY_HEADER = api.IDEMPOTENCY_HEADER.lower().encode("latin-1")

B = TypeVar("B", bound=BaseModel)

ERROR_STATUSES = {
    "400": "Invalid input (code validation_error)",
    "401": "Missing bearer token",
    "403": "Wrong bearer token",
    "404": "Unknown rollout, attempt or resources id (code not_found)",
    "405": "Method not allowed on this path",
    "409": "Impossible status change (code invalid_transition)",
    "413": "Request body too large",
    "422": "Body or query fails validation; the message names the field",
    "503": "The store's database is unavailable (code store_unavailable); retry later",
}
SCHEMA_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Call(Generic[B]):
    """One store request: the server state, the validated input and the path parameters."""

    state: serving.ServerState
    input: B
    path: dict[str, str]

    @property
    def store(self) -> Store:
        return self.state.store


class _Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


Operation = Callable[[Call[Any]], Awaitable[bytes]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    name: str
    operation: Operation
    summary: str
    response: TypeAdapter[Any]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    list_fields: frozenset[str] = frozenset()
    idempotent: bool = False


# -- operations -------------------------------------------------------------------------------------


async def _enqueue(call: Call[api.EnqueueBody]) -> bytes:
    return api.ROLLOUTS.dump_json(await call.store.enqueue(call.input.requests))


async def _start_rollout(call: Call[api.StartRolloutBody]) -> bytes:
    return api.ATTEMPTED.dump_json(await call.store.start_rollout(call.input.request, call.input.worker_id))


async def _claim(call: Call[api.ClaimBody]) -> bytes:
    body = call.input
    wait_seconds = min(body.wait_seconds, call.state.config.max_wait_seconds)
    work = call.store.claim(body.worker_id, body.limit, wait_seconds)
    if wait_seconds > 0:

        async def nothing() -> list[Any]:
            return []

        return api.ATTEMPTEDS.dump_json(await call.state.draining.hold(work, nothing))
    return api.ATTEMPTEDS.dump_json(await work)


async def _get_rollout(call: Call[_Empty]) -> bytes:
    return api.ROLLOUT.dump_json(await call.store.get_rollout(call.path["rollout_id"]))


async def _query_rollouts(call: Call[api.QueryRolloutsParams]) -> bytes:
    q = call.input
    statuses = None if q.status is None else [status for status in q.status if status]
    rollouts = await call.store.query_rollouts(
        status=statuses, group_id=q.group_id, mode=q.mode, limit=q.limit, offset=q.offset, order=q.order
    )
    return api.ROLLOUTS.dump_json(rollouts)


async def _cancel(call: Call[api.CancelBody]) -> bytes:
    return api.ROLLOUTS.dump_json(await call.store.cancel(call.input.rollout_ids))


async def _start_attempt(call: Call[api.StartAttemptBody]) -> bytes:
    return api.ATTEMPTED.dump_json(
        await call.store.start_attempt(call.path["rollout_id"], call.input.worker_id)
    )


async def _update_attempt(call: Call[api.UpdateAttemptBody]) -> bytes:
    body = call.input
    attempt = await call.store.update_attempt(
        call.path["rollout_id"],
        call.path["attempt_id"],
        status=body.status,
        error=body.error,
        metadata=body.metadata,
    )
    return api.ATTEMPT.dump_json(attempt)


async def _list_attempts(call: Call[_Empty]) -> bytes:
    return api.ATTEMPTS.dump_json(await call.store.list_attempts(call.path["rollout_id"]))


async def _add_spans(call: Call[api.AddSpansBody]) -> bytes:
    return api.SPANS.dump_json(await call.store.add_spans(call.input.spans))


async def _query_spans(call: Call[api.QuerySpansParams]) -> bytes:
    q = call.input
    spans = await call.store.query_spans(
        call.path["rollout_id"], q.attempt_id, name=q.name, limit=q.limit, offset=q.offset
    )
    return api.SPANS.dump_json(spans)


async def _put_resources(call: Call[api.PutResourcesBody]) -> bytes:
    stored = await call.store.put_resources(call.input.resources, call.input.resources_id)
    return api.RESOURCES_VERSION.dump_json(stored)


async def _get_resources(call: Call[api.GetResourcesParams]) -> bytes:
    return api.MAYBE_RESOURCES_VERSION.dump_json(await call.store.get_resources(call.input.resources_id))


async def _heartbeat(call: Call[api.HeartbeatBody]) -> bytes:
    body = call.input
    return api.WORKER.dump_json(await call.store.heartbeat(body.worker_id, body.stats, body.attempt_ids))


async def _list_workers(call: Call[_Empty]) -> bytes:
    return api.WORKERS.dump_json(await call.store.list_workers())


async def _wait(call: Call[api.WaitBody]) -> bytes:
    body = call.input
    timeout_seconds = min(body.timeout_seconds, call.state.config.max_wait_seconds)
    work = call.store.wait(body.rollout_ids, timeout_seconds)
    if timeout_seconds > 0:
        done = await call.state.draining.hold(work, lambda: call.store.wait(body.rollout_ids, 0))
        return api.ROLLOUTS.dump_json(done)
    return api.ROLLOUTS.dump_json(await work)


async def _stats(call: Call[_Empty]) -> bytes:
    return api.STATS.dump_json(await call.store.stats())


ROUTES = (
    Route("POST", "/rollouts", "enqueue", _enqueue, "Enqueue rollouts", api.ROLLOUTS,
          body=api.EnqueueBody, idempotent=True),
    Route("GET", "/rollouts", "query_rollouts", _query_rollouts, "Query rollouts", api.ROLLOUTS,
          query=api.QueryRolloutsParams, list_fields=frozenset({"status"})),
    Route("POST", "/rollouts/start", "start_rollout", _start_rollout,
          "Create a rollout and its first attempt, skipping the queue", api.ATTEMPTED,
          body=api.StartRolloutBody, idempotent=True),
    Route("POST", "/rollouts/claim", "claim", _claim,
          "Claim queued rollouts, oldest first (long-poll with wait_seconds)", api.ATTEMPTEDS,
          body=api.ClaimBody, idempotent=True),
    Route("POST", "/rollouts/cancel", "cancel", _cancel, "Cancel rollouts", api.ROLLOUTS,
          body=api.CancelBody, idempotent=True),
    Route("POST", "/rollouts/wait", "wait", _wait,
          "Wait until rollouts are terminal (long-poll); returns the terminal ones", api.ROLLOUTS,
          body=api.WaitBody),
    Route("GET", "/rollouts/{rollout_id}", "get_rollout", _get_rollout, "Get a rollout", api.ROLLOUT),
    Route("POST", "/rollouts/{rollout_id}/attempts", "start_attempt", _start_attempt,
          "Start a new attempt for a queued rollout", api.ATTEMPTED,
          body=api.StartAttemptBody, idempotent=True),
    Route("GET", "/rollouts/{rollout_id}/attempts", "list_attempts", _list_attempts,
          "List a rollout's attempts", api.ATTEMPTS),
    Route("PATCH", "/rollouts/{rollout_id}/attempts/{attempt_id}", "update_attempt", _update_attempt,
          "Update an attempt's status, error or metadata", api.ATTEMPT,
          body=api.UpdateAttemptBody, idempotent=True),
    Route("GET", "/rollouts/{rollout_id}/spans", "query_spans", _query_spans,
          "Query a rollout's spans", api.SPANS, query=api.QuerySpansParams),
    Route("POST", "/spans", "add_spans", _add_spans,
          "Add spans in one batch (idempotent by span_id)", api.SPANS, body=api.AddSpansBody),
    Route("POST", "/resources", "put_resources", _put_resources, "Store a new resources version",
          api.RESOURCES_VERSION, body=api.PutResourcesBody, idempotent=True),
    Route("GET", "/resources", "get_resources", _get_resources,
          "Get resources by id, or the latest (null when none)", api.MAYBE_RESOURCES_VERSION,
          query=api.GetResourcesParams),
    Route("POST", "/workers/heartbeat", "heartbeat", _heartbeat, "Record a worker heartbeat", api.WORKER,
          body=api.HeartbeatBody),
    Route("GET", "/workers", "list_workers", _list_workers, "List workers", api.WORKERS),
    Route("GET", "/stats", "stats", _stats, "Counts per status", api.STATS),
)  # fmt: skip


# -- serving ----------------------------------------------------------------------------------------

# A percent-encoded slash inside an id must not split its path segment; it travels as this
# character while routing, and turns back into "/" in the path parameters.
_SLASH = "\u2215"


class StoreAPI:
    """ASGI app that serves every path under ``/api/v1`` (the app in front of it sends only those).

    Answers are built whole, then sent; an unexpected failure is logged and answered with a 500.
    """

    def __init__(self, state: serving.ServerState) -> None:
        self.state = state
        self._table = [(route, _pattern(route.path), _endpoint(route, state)) for route in ROUTES]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        raw = scope.get("raw_path") or b""
        if b"%2f" in raw.lower():
            path = "/".join(
                unquote(part).replace("/", _SLASH)
                for part in raw.decode("ascii", "replace").split("?")[0].split("/")
            )
        try:
            answer = await self._dispatch(path[len(api.PREFIX) :], scope, receive)
        except Exception:
            logger.exception("%s %s failed", scope["method"], scope["path"])
            answer = serving.internal_error_answer()
        await answer.send(send)

    async def _dispatch(self, path: str, scope: Scope, receive: Receive) -> serving.Answer:
        # The first route whose pattern matches names the path (literal routes come first in
        # ROUTES, so /rollouts/start is never read as a rollout id); its siblings share the path.
        template: str | None = None
        allowed: list[str] = []
        for route, pattern, endpoint in self._table:
            if template is not None and route.path != template:
                continue
            match = pattern.fullmatch(path)
            if match is None:
                continue
            template = route.path
            if route.method != scope["method"]:
                allowed.append(route.method)
                continue
            params = {k: v.replace(_SLASH, "/") for k, v in match.groupdict().items()}
            return await endpoint(scope, receive, params)
        where = f"{scope['method']} {scope['path']}"
        if allowed:
            message = f"{where}: use {' or '.join(allowed)}; see /openapi.json"
            return serving.error_answer(
                405, "method_not_allowed", message, headers={"Allow": ", ".join(allowed)}
            )
        return serving.error_answer(404, "route_not_found", f"{where}: no such route; see /openapi.json")


def _pattern(path: str) -> re.Pattern[str]:
    # An empty id is still an id: the store answers it (not_found), as it does for local callers.
    return re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]*)", path))


Endpoint = Callable[[Scope, Receive, dict[str, str]], Awaitable[serving.Answer]]


def _endpoint(route: Route, state: serving.ServerState) -> Endpoint:
    async def run(scope: Scope, body: bytes, params: dict[str, str]) -> serving.Answer:
        data: BaseModel
        if route.body is not None:
            # Strict: JSON types must match the schema (no false for a number), as the OpenAPI spec says.
            data = route.body.model_validate_json(body or b"{}", strict=True)
        else:
            data = serving.read_query(scope["query_string"], route.query or _Empty, route.list_fields)
        return serving.Answer(200, await route.operation(Call(state, data, params)))

    async def endpoint(scope: Scope, receive: Receive, params: dict[str, str]) -> serving.Answer:
        key = serving.header(scope, _IDEMPOTENCY_HEADER) if route.idempotent else None
        if key is not None and len(key) > api.MAX_IDEMPOTENCY_KEY_LENGTH:
            message = f"{api.IDEMPOTENCY_HEADER} must be at most {api.MAX_IDEMPOTENCY_KEY_LENGTH} characters"
            return serving.error_answer(422, "validation_error", message)
        try:
            body = await serving.read_body(receive) if route.body is not None else b""
        except FulgorError as error:
            return serving.fulgor_error_answer(error)
        if key is None:
            return await serving.guarded(lambda: run(scope, body, params))
        cache_key = (route.method, scope["path"], key.decode("latin-1"))
        return await state.idempotency.run(
            cache_key, body, lambda: serving.guarded(lambda: run(scope, body, params))
        )

    return endpoint


# -- OpenAPI ----------------------------------------------------------------------------------------


def openapi_paths(responses: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """OpenAPI path items for every store route; ``responses`` maps a route name to its 200 schema."""
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        operation: dict[str, Any] = {"tags": ["store"], "summary": route.summary, "operationId": route.name}
        operation.update(_openapi_operation(route))
        operation["responses"]["200"]["content"]["application/json"]["schema"] = responses[route.name]
        paths.setdefault(api.PREFIX + route.path, {})[route.method.lower()] = operation
    return paths


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": SCHEMA_REF.format(model=model.__name__)}


def json_content(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _openapi_operation(route: Route) -> dict[str, Any]:
    """Request body, parameters and responses of a route, pointing at component schemas."""
    responses = {"200": json_content("OK", {})}
    for status, description in ERROR_STATUSES.items():
        responses[status] = json_content(description, ref(api.ErrorBody))
    operation: dict[str, Any] = {"responses": responses}
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in ("rollout_id", "attempt_id")
        if "{" + name + "}" in route.path
    ]
    if route.query is not None:
        parameters += _query_parameters(route.query, route.list_fields)
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        operation["requestBody"] = {"required": True, **json_content("", ref(route.body))}
        del operation["requestBody"]["description"]
    if route.idempotent:
        parameters.append(
            {
                "name": api.IDEMPOTENCY_HEADER,
                "in": "header",
                "required": False,
                "description": "A retried request with the same key gets the first answer.",
                "schema": {"type": "string", "maxLength": api.MAX_IDEMPOTENCY_KEY_LENGTH},
            }
        )
        operation["parameters"] = parameters
    return operation


def _query_parameters(model: type[BaseModel], list_fields: frozenset[str]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=SCHEMA_REF)
    parameters = []
    for name, prop in schema["properties"].items():
        options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
        value = {k: v for k, v in options[0].items() if k != "title"}
        parameter: dict[str, Any] = {"name": name, "in": "query", "required": False, "schema": value}
        if "description" in prop:
            parameter["description"] = prop["description"]
        if name in list_fields:
            parameter.update(style="form", explode=True)
        parameters.append(parameter)
    return parameters
