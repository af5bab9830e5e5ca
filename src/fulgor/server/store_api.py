"""The store's routes: one small function per Store operation, served under ``/api/v1``.

Each route reads the raw body, validates it with ``model_validate_json`` (strict: JSON types must
match the spec), calls the store and answers JSON bytes serialised once. Writes that are not
naturally idempotent honour an ``Idempotency-Key`` (:mod:`fulgor.server.idempotency`); long-polls
(``claim`` with ``wait_seconds``, ``wait``) are capped at ``max_wait_seconds`` and answered at once
when the server starts to shut down. :mod:`fulgor.server.openapi` describes the same table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter

from fulgor.server import routing
from fulgor.server.config import ServerConfig
from fulgor.server.draining import Draining
from fulgor.server.http import (
    Answer,
    Receive,
    Scope,
    error_answer,
    guarded,
    header,
    read_body,
    read_query,
)
from fulgor.server.idempotency import IdempotencyCache
from fulgor.store import http_api as api
from fulgor.store.base import Store

__all__ = ["OPERATIONS", "Operation", "StoreState", "store_routes"]

_IDEMPOTENCY_HEADER = api.IDEMPOTENCY_HEADER.lower().encode("latin-1")

B = TypeVar("B", bound=BaseModel)


@dataclass
class StoreState:
    """What every store route reaches: the config (and its store), idempotency keys, draining."""

    config: ServerConfig
    draining: Draining
    idempotency: IdempotencyCache = field(init=False)

    def __post_init__(self) -> None:
        self.idempotency = IdempotencyCache(self.config.idempotency_entries)

    @property
    def store(self) -> Store:
        return self.config.store


@dataclass(frozen=True)
class Call(Generic[B]):
    """One store request: the state, the validated input and the path parameters."""

    state: StoreState
    input: B
    path: dict[str, str]

    @property
    def store(self) -> Store:
        return self.state.store


class _Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


Run = Callable[[Call[Any]], Awaitable[bytes | Answer]]


@dataclass(frozen=True)
class Operation:
    """One store operation as an HTTP route: where it is, what it reads, what it answers."""

    method: str
    path: str
    name: str
    run: Run
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


async def _query_spans(call: Call[api.QuerySpansParams]) -> Answer:
    q = call.input
    spans = await call.store.query_spans(
        call.path["rollout_id"], q.attempt_id, name=q.name, limit=q.limit, offset=q.offset
    )
    # The body stays a plain list of spans; how many stored ones did not read back goes beside it.
    unreadable = getattr(spans, "spans_unreadable", 0)
    return Answer(200, api.SPANS.dump_json(spans), ((_UNREADABLE_HEADER, b"%d" % unreadable),))


_UNREADABLE_HEADER = api.SPANS_UNREADABLE_HEADER.lower().encode("latin-1")


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


OPERATIONS = (
    Operation("POST", "/rollouts", "enqueue", _enqueue, "Enqueue rollouts", api.ROLLOUTS,
          body=api.EnqueueBody, idempotent=True),
    Operation("GET", "/rollouts", "query_rollouts", _query_rollouts, "Query rollouts", api.ROLLOUTS,
          query=api.QueryRolloutsParams, list_fields=frozenset({"status"})),
    Operation("POST", "/rollouts/start", "start_rollout", _start_rollout,
          "Create a rollout and its first attempt, skipping the queue", api.ATTEMPTED,
          body=api.StartRolloutBody, idempotent=True),
    Operation("POST", "/rollouts/claim", "claim", _claim,
          "Claim queued rollouts, oldest first (long-poll with wait_seconds)", api.ATTEMPTEDS,
          body=api.ClaimBody, idempotent=True),
    Operation("POST", "/rollouts/cancel", "cancel", _cancel, "Cancel rollouts", api.ROLLOUTS,
          body=api.CancelBody, idempotent=True),
    Operation("POST", "/rollouts/wait", "wait", _wait,
          "Wait until rollouts are terminal (long-poll); returns the terminal ones", api.ROLLOUTS,
          body=api.WaitBody),
    Operation("GET", "/rollouts/{rollout_id}", "get_rollout", _get_rollout, "Get a rollout", api.ROLLOUT),
    Operation("POST", "/rollouts/{rollout_id}/attempts", "start_attempt", _start_attempt,
          "Start a new attempt for a queued rollout", api.ATTEMPTED,
          body=api.StartAttemptBody, idempotent=True),
    Operation("GET", "/rollouts/{rollout_id}/attempts", "list_attempts", _list_attempts,
          "List a rollout's attempts", api.ATTEMPTS),
    Operation("PATCH", "/rollouts/{rollout_id}/attempts/{attempt_id}", "update_attempt", _update_attempt,
          "Update an attempt's status, error or metadata", api.ATTEMPT,
          body=api.UpdateAttemptBody, idempotent=True),
    Operation("GET", "/rollouts/{rollout_id}/spans", "query_spans", _query_spans,
          "Query a rollout's spans", api.SPANS, query=api.QuerySpansParams),
    Operation("POST", "/spans", "add_spans", _add_spans,
          "Add spans in one batch (idempotent by span_id)", api.SPANS, body=api.AddSpansBody),
    Operation("POST", "/resources", "put_resources", _put_resources, "Store a new resources version",
          api.RESOURCES_VERSION, body=api.PutResourcesBody, idempotent=True),
    Operation("GET", "/resources", "get_resources", _get_resources,
          "Get resources by id, or the latest (null when none)", api.MAYBE_RESOURCES_VERSION,
          query=api.GetResourcesParams),
    Operation("POST", "/workers/heartbeat", "heartbeat", _heartbeat, "Record a worker heartbeat", api.WORKER,
          body=api.HeartbeatBody),
    Operation("GET", "/workers", "list_workers", _list_workers, "List workers", api.WORKERS),
    Operation("GET", "/stats", "stats", _stats, "Counts per status", api.STATS),
)  # fmt: skip


# -- serving ----------------------------------------------------------------------------------------


def store_routes(state: StoreState) -> list[routing.Route]:
    """The server's routes for every store operation (under ``/api/v1``), bound to ``state``."""
    return [
        routing.Route(operation.method, api.PREFIX + operation.path, _endpoint(operation, state))
        for operation in OPERATIONS
    ]


def _endpoint(operation: Operation, state: StoreState) -> routing.Endpoint:
    limit = state.config.max_body_bytes

    async def run(scope: Scope, body: bytes, params: dict[str, str]) -> Answer:
        data: BaseModel
        if operation.body is not None:
            # Strict: JSON types must match the schema (no false for a number), as the OpenAPI spec says.
            data = operation.body.model_validate_json(body or b"{}", strict=True)
        else:
            data = read_query(scope["query_string"], operation.query or _Empty, operation.list_fields)
        answer = await operation.run(Call(state, data, params))
        return answer if isinstance(answer, Answer) else Answer(200, answer)

    async def endpoint(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        key = header(scope, _IDEMPOTENCY_HEADER) if operation.idempotent else None
        if key is not None and len(key) > api.MAX_IDEMPOTENCY_KEY_LENGTH:
            message = f"{api.IDEMPOTENCY_HEADER} must be at most {api.MAX_IDEMPOTENCY_KEY_LENGTH} characters"
            return error_answer(400, "validation_error", message)
        body = await read_body(receive, limit) if operation.body is not None else b""
        if key is None:
            return await guarded(lambda: run(scope, body, params))
        cache_key = (operation.method, scope["path"], key.decode("latin-1"))
        return await state.idempotency.run(cache_key, body, lambda: guarded(lambda: run(scope, body, params)))

    return endpoint
