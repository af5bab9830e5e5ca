"""Gateway: the ASGI app behind ``/r/{rollout_id}/{attempt_id}/v1`` that records every model call.

Routes (all under one base URL per attempt, see docs/architecture.md, "Gateway URLs"):
``POST .../v1/chat/completions``, ``POST .../v1/completions``, ``GET .../v1/models`` (OpenAI),
``POST .../v1/responses`` (OpenAI Responses) and ``POST .../v1/messages`` (Anthropic Messages); the
last two are translated to chat completions, so the recorded request is always a chat or text
completion with the engine's token ids. Admin: ``GET /gateway/state``, ``POST /gateway/pause``,
``POST /gateway/resume``.

The hot path parses the request once, forwards it with the token id request added, and passes the
upstream's bytes back unchanged (OpenAI) or translated (Anthropic, Responses). The response is
recorded after it is sent, by :class:`~fulgor.gateway.recorder.Recorder`, off the response path.
The app is a plain ASGI callable, so ``fulgor serve`` can route ``/r/`` and ``/gateway/`` to it; it
then calls :meth:`Gateway.start` and :meth:`Gateway.close` from its own lifespan.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import orjson

from fulgor import limits
from fulgor.credentials import is_attempt_credential
from fulgor.errors import ValidationError
from fulgor.gateway import anthropic, responses_api
from fulgor.gateway.config import GatewayConfig, Upstream
from fulgor.gateway.errors import (
    BadRequestError,
    ForbiddenError,
    GatewayError,
    GatewayPausedError,
    PayloadTooLargeError,
    RolloutNotFoundError,
    UnauthorizedError,
)
from fulgor.gateway.errors import RequestTimeoutError as GatewayRequestTimeoutError
from fulgor.gateway.extract import Endpoint
from fulgor.gateway.guard import RolloutGuard
from fulgor.gateway.model_names import ModelNames
from fulgor.gateway.proxy import Api, CallContext, forward_call
from fulgor.gateway.recorder import CallRecord, Recorder
from fulgor.gateway.upstreams import UpstreamPool, check_upstreams
from fulgor.net.http_client import HttpClient
from fulgor.net.request_body import (
    RequestIncompleteError,
    RequestTimeoutError,
    RequestTooLargeError,
    read_body,
)
from fulgor.store import _rules as rules
from fulgor.store.base import Store

__all__ = ["Gateway", "create_gateway_app"]

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]
Scope = MutableMapping[str, Any]
Receive = Any
Send = Any

_ENDPOINTS: dict[str, Endpoint] = {
    "chat/completions": "chat",
    "completions": "completions",
    "messages": "chat",
    "responses": "chat",
}
_APIS: dict[str, Api] = {"messages": "anthropic", "responses": "responses"}
_TRANSLATIONS = {"messages": anthropic.request_to_chat, "responses": responses_api.request_to_chat}
_SERVED = "chat/completions, completions, models, responses and messages"


def create_gateway_app(
    store: Store, upstreams: Sequence[Upstream | str], config: GatewayConfig | None = None
) -> Gateway:
    """The gateway as an ASGI app; upstreams may be given as base URLs."""
    replicas = [u if isinstance(u, Upstream) else Upstream(u) for u in upstreams]
    return Gateway(store, replicas, config or GatewayConfig())


class Gateway:
    """ASGI app: per-rollout OpenAI/Anthropic endpoints, recording, pause/drain; see module docstring."""

    def __init__(self, store: Store, upstreams: Sequence[Upstream], config: GatewayConfig) -> None:
        self.config = config
        self.store = store
        self._client = HttpClient(
            connect_timeout_seconds=config.connect_timeout_seconds,
            read_timeout_seconds=config.read_timeout_seconds,
        )
        self.upstreams = self._pool(upstreams)
        self.recorder = Recorder(
            store,
            queue_size=config.record_queue_size,
            batch_size=config.record_batch_size,
            linger_seconds=config.record_linger_seconds,
            retry_seconds=config.record_retry_seconds,
        )
        self._guard = RolloutGuard(store, config.rollout_cache_seconds) if config.check_rollouts else None
        self._model_names = ModelNames(store, config.model_map, config.default_model)
        self._operator_key = config.api_key or ""
        self._api_key = config.api_key.encode() if config.api_key else None
        self.model_version = config.model_version
        self.paused = False
        self.retry_after_seconds = config.retry_after_seconds
        self.in_flight = 0
        self._idle: asyncio.Event | None = None
        self._rollout_calls: dict[str, int] = {}
        self._call_ended = asyncio.Event()
        self._started = False

    def _pool(self, upstreams: Sequence[Upstream]) -> UpstreamPool:
        return UpstreamPool(
            upstreams,
            self._client,
            max_retries=self.config.max_retries,
            retry_backoff_seconds=self.config.retry_backoff_seconds,
        )

    # -- lifecycle and admin (Python API) ---------------------------------------------------------

    async def start(self) -> None:
        """Check the upstreams (:func:`~fulgor.gateway.upstreams.check_upstreams`: ConfigError for
        one that is no OpenAI base URL) and start the recorder; called by the ASGI lifespan or,
        failing that, by the first call."""
        if self._started:
            return
        checked = await check_upstreams(self.upstreams.upstreams, self.config.connect_timeout_seconds)
        if checked != list(self.upstreams.upstreams):
            self.upstreams = self._pool(checked)
        self._started = True
        self._idle = asyncio.Event()
        self._idle.set()
        self.recorder.start()

    async def close(self) -> None:
        """Write what is still queued, then close upstream connections."""
        await self.recorder.close()
        await self._client.close()
        self._started = False

    def pause(self, retry_after_seconds: float | None = None) -> None:
        """New calls, and calls not yet forwarded upstream, get 429 with Retry-After; calls already
        forwarded go on (see :meth:`drain`)."""
        self.paused = True
        if retry_after_seconds is not None:
            self.retry_after_seconds = retry_after_seconds
        logger.info("gateway paused with %d calls in flight", self.in_flight)

    async def drain(self, timeout_seconds: float) -> bool:
        """Wait until no call is in flight; False when ``timeout_seconds`` passed first."""
        if self._idle is None or self._idle.is_set():
            return True
        try:
            async with asyncio.timeout(timeout_seconds):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def drain_rollouts(self, rollout_ids: Iterable[str], timeout_seconds: float) -> bool:
        """Wait until no call of ``rollout_ids`` is in flight, while other rollouts' calls go on
        (a trainer reading ended rollouts while the next ones run); False on timeout. A call that
        has left flight has also been handed to the recorder."""
        wanted = set(rollout_ids)
        try:
            async with asyncio.timeout(timeout_seconds):
                while not wanted.isdisjoint(self._rollout_calls):
                    await self._call_ended.wait()
        except TimeoutError:
            return False
        return True

    async def settle(self, rollout_ids: Iterable[str] | None = None, timeout_seconds: float = 60.0) -> bool:
        """Wait until no call is in flight (only those of ``rollout_ids``, when given: other
        rollouts' calls go on) and every call that has left flight is in the store, or counted in
        :meth:`spans_lost`. False when calls were still in flight after ``timeout_seconds``; the
        calls that had ended are written even then."""
        if rollout_ids is None:
            drained = await self.drain(timeout_seconds)
        else:
            drained = await self.drain_rollouts(rollout_ids, timeout_seconds)
        await self.recorder.caught_up()
        return drained

    def spans_lost(self, rollout_id: str) -> int:
        """How many model call spans of ``rollout_id`` the store never got (each was logged)."""
        return self.recorder.writer.lost_for(rollout_id)

    def resume(self, model_version: int | None = None) -> None:
        """Take calls again; ``model_version`` is recorded on calls whose upstream names none."""
        if model_version is not None:
            self.model_version = model_version
        self.paused = False
        logger.info("gateway resumed (model version %s)", self.model_version)

    def state(self) -> JsonDict:
        written = self.recorder.writer.stats
        return {
            "paused": self.paused,
            "in_flight": self.in_flight,
            "retry_after_seconds": self.retry_after_seconds,
            "model_version": self.model_version,
            "upstreams": [u.url for u in self.upstreams.upstreams],
            "recorder": {
                "pending": self.recorder.pending,
                "written": written.written,
                "spans_lost": written.lost,
                "store_retries": written.retries,
                "token_ids_missing": self.recorder.token_ids_missing,
            },
        }

    # -- ASGI -------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._started:
            await self.start()
        path: str = scope["path"]
        try:
            if path.startswith("/r/"):
                await self._rollout_route(scope, receive, send, path)
            elif path.startswith("/gateway/"):
                await self._admin_route(scope, receive, send, path)
            else:
                raise RolloutNotFoundError(
                    f"no route {path}; model calls go to /r/ROLLOUT_ID/ATTEMPT_ID/v1/..."
                )
        except GatewayError as error:
            await _send_error(send, error, _api_of(path))

    async def _rollout_route(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        parts = path.split("/", 5)
        if len(parts) < 6 or parts[4] != "v1":
            raise RolloutNotFoundError(f"no route {path}; model calls go to /r/ROLLOUT_ID/ATTEMPT_ID/v1/...")
        rollout_id, attempt_id, rest = parts[2], parts[3], parts[5].rstrip("/")
        self._authorize(scope, (rollout_id, attempt_id))
        method = scope["method"]
        if method == "GET" and rest == "models":
            await self._check_rollout(rollout_id, attempt_id)
            await self._models(send, rollout_id)
        elif method == "POST" and rest in _ENDPOINTS:
            await self._call(scope, receive, send, rollout_id, attempt_id, rest)
        elif rest.startswith("responses/"):
            raise RolloutNotFoundError(
                f"no route {method} /v1/{rest}: the gateway stores no responses, so it cannot retrieve, "
                "cancel or list one; it serves POST /v1/responses with the full input in each call"
            )
        else:
            raise RolloutNotFoundError(f"no route {method} /v1/{rest}; the gateway serves {_SERVED}")

    async def _check_rollout(self, rollout_id: str, attempt_id: str) -> None:
        _check_ids(rollout_id, attempt_id)
        if self._guard is not None:
            await self._guard.check(rollout_id, attempt_id)

    def _authorize(self, scope: Scope, attempt: tuple[str, str] | None = None) -> None:
        """The run's operator key works everywhere; an attempt's credential only for ``attempt``'s
        URL (an admin route takes none). 401 when no key was sent, 403 when a wrong one was."""
        if self._api_key is None:
            return
        sent = False
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                value = value[7:].strip()
            elif name != b"x-api-key":
                continue
            sent = True
            if hmac.compare_digest(value, self._api_key):
                return
            if attempt is not None and is_attempt_credential(self._operator_key, *attempt, value):
                return
        if sent and attempt is None:
            raise ForbiddenError("the gateway's admin routes need the run's operator key")
        if sent:
            raise ForbiddenError(
                "the key sent is not this attempt's credential: an agent calls only its own rollout's "
                "URL, with the key its runner handed it (the operator key works for any URL)"
            )
        raise UnauthorizedError(
            "this gateway needs a key: send the key the runner handed this agent (or the run's operator "
            "key) as the API key (Authorization: Bearer or x-api-key)"
        )

    async def _models(self, send: Send, rollout_id: str) -> None:
        response, _ = await self.upstreams.send(rollout_id, "GET", "/models")
        body = await response.read()
        await _send_bytes(
            send, response.status, body, response.headers.get("content-type", "application/json")
        )

    async def _call(
        self, scope: Scope, receive: Receive, send: Send, rollout_id: str, attempt_id: str, route: str
    ) -> None:
        self._refuse_if_paused()
        # Counted in flight before the first await, so pause + drain (and drain_rollouts) wait for
        # a call that is still checking its rollout, reading its body or waiting for a slot.
        self._enter(rollout_id)
        try:
            await self._check_rollout(rollout_id, attempt_id)
            body = await _read_body(
                receive, self.config.max_body_bytes, self.config.body_timeout_seconds, scope
            )
            request = _parse_object(body, required=True)
            translate = _TRANSLATIONS.get(route)
            upstream_request = translate(request) if translate else request
            _check_recordable(upstream_request)
            sent = upstream_request.get("model")
            sent = sent if isinstance(sent, str) else None
            record = CallRecord(rollout_id, attempt_id, _ENDPOINTS[route], upstream_request, time.time())
            _read_call_headers(scope, record)
            served = await self._model_names.upstream_model(rollout_id, sent, record.agent_name)
            if served != sent:
                record.request = {**upstream_request, "model": served}
            record.requested_model = sent if served != sent else None
            await self._reserve_unless_paused()
            # Read after the last pause check: a call let through after resume() gets the new version.
            record.model_version = self.model_version
            try:
                context = CallContext(record, _APIS.get(route, "openai"), request, receive, send)
                await forward_call(self.upstreams, context)
            finally:
                self.recorder.submit(record)
        finally:
            self._leave(rollout_id)

    async def _reserve_unless_paused(self) -> None:
        """A recorder slot, then the pause check again: pause() may have come while the call was
        being checked or waiting for the slot, and a paused call must not reach the engine."""
        await self.recorder.reserve()
        if self.paused:
            self.recorder.unreserve()
            self._refuse_if_paused()

    def _refuse_if_paused(self) -> None:
        if self.paused:
            raise GatewayPausedError(
                "the gateway is paused while weights update; retry later", self.retry_after_seconds
            )

    def _enter(self, rollout_id: str) -> None:
        self.in_flight += 1
        self._rollout_calls[rollout_id] = self._rollout_calls.get(rollout_id, 0) + 1
        if self._idle is not None:
            self._idle.clear()

    def _leave(self, rollout_id: str) -> None:
        self.in_flight -= 1
        if self._rollout_calls[rollout_id] > 1:
            self._rollout_calls[rollout_id] -= 1
        else:
            del self._rollout_calls[rollout_id]
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()
        # Wake every drain_rollouts waiter once; each checks its own rollouts again.
        ended, self._call_ended = self._call_ended, asyncio.Event()
        ended.set()

    async def _admin_route(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        self._authorize(scope)
        method = scope["method"]
        body = _parse_object(await _read_body(receive), required=False) if method == "POST" else {}
        if method == "GET" and path == "/gateway/state":
            pass
        elif method == "POST" and path == "/gateway/pause":
            self.pause(_number(body, "retry_after_seconds"))
            drain_timeout = _number(body, "drain_timeout_seconds")
            if drain_timeout is not None:
                drained = await self.drain(drain_timeout)
                await _send_json(send, 200, {**self.state(), "drained": drained})
                return
        elif method == "POST" and path == "/gateway/resume":
            self.resume(_version(body))
        else:
            raise RolloutNotFoundError(f"no admin route {method} {path}; see /gateway/state, /pause, /resume")
        await _send_json(send, 200, self.state())


def _read_call_headers(scope: Scope, record: CallRecord) -> None:
    for name, value in scope["headers"]:
        if name == b"x-fulgor-agent":
            record.agent_name = value.decode("utf-8", "replace")
        elif name == b"traceparent":
            parts = value.decode("latin-1").split("-")
            if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
                record.trace_id, record.parent_id = parts[1], parts[2]


async def _read_body(
    receive: Receive,
    max_body_bytes: int = limits.MAX_MODEL_CALL_BODY_BYTES,
    timeout_seconds: float = limits.BODY_TIMEOUT_SECONDS,
    scope: Scope | None = None,
) -> bytes:
    """The request body: 413 past ``max_body_bytes`` (at once when ``Content-Length`` says so),
    408 when a part takes longer than ``timeout_seconds``, 400 when the client goes first."""
    declared = _content_length(scope)
    if declared is not None and declared > max_body_bytes:
        raise PayloadTooLargeError(_too_large(max_body_bytes))
    try:
        return await read_body(receive, max_body_bytes, timeout_seconds)
    except RequestTooLargeError:
        raise PayloadTooLargeError(_too_large(max_body_bytes)) from None
    except RequestTimeoutError as error:  # the gateway's own timeout, or the server's it is mounted in
        raise GatewayRequestTimeoutError(error.message) from None
    except RequestIncompleteError:
        raise BadRequestError("the client went away before its request body arrived") from None


def _content_length(scope: Scope | None) -> int | None:
    for name, value in scope["headers"] if scope is not None else ():
        if name == b"content-length":
            return int(value) if value.isdigit() and len(value) < 19 else None
    return None


def _too_large(max_body_bytes: int) -> str:
    return (
        f"the request body is larger than {max_body_bytes} bytes, the gateway's limit "
        "(GatewayConfig.max_body_bytes); send a shorter conversation or fewer tools"
    )


# The call's record holds the request two levels down (attributes -> fulgor.model_call -> request),
# and the store refuses attributes nested past MAX_JSON_DEPTH: a deeper request would be answered
# and then lost from its rollout's record.
_MAX_REQUEST_DEPTH = limits.MAX_JSON_DEPTH - 2


def _check_recordable(request: JsonDict) -> None:
    """400 for a request the store could not record and read back, before it goes upstream."""
    if rules.nests_deeper_than(request, _MAX_REQUEST_DEPTH):
        raise BadRequestError(
            f"the request nests JSON more than {_MAX_REQUEST_DEPTH} levels deep (fulgor.limits."
            f"MAX_JSON_DEPTH, {limits.MAX_JSON_DEPTH}, less the 2 levels its record adds); flatten "
            "its tool schemas or messages"
        )


def _check_ids(rollout_id: str, attempt_id: str) -> None:
    """400 for ids no rollout can have (too long, NUL characters), without echoing them whole."""
    try:
        rules.check_text(rollout_id, "the URL's rollout id")
        rules.check_text(attempt_id, "the URL's attempt id")
    except ValidationError as error:
        raise BadRequestError(error.message) from None


def _parse_object(body: bytes, *, required: bool) -> JsonDict:
    if not body:
        if required:
            raise BadRequestError("the request body is empty; send a JSON object")
        return {}
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequestError(f"the request body is not valid JSON ({error}); send a JSON object") from None
    if not isinstance(parsed, dict):
        raise BadRequestError("the request body must be a JSON object")
    return parsed


def _version(body: JsonDict) -> int | None:
    value = body.get("model_version")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequestError("model_version must be a whole number >= 0 (the engine's weights version)")
    return value


def _number(body: JsonDict, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or value < 0:
        raise BadRequestError(f"{key} must be a number >= 0")
    return float(value)


async def _send_bytes(
    send: Send, status: int, body: bytes, content_type: str, extra: Sequence[Any] = ()
) -> None:
    headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, payload: JsonDict) -> None:
    await _send_bytes(send, status, orjson.dumps(payload), "application/json")


def _api_of(path: str) -> Api:
    """The API whose error shape answers ``path``."""
    if path.rstrip("/").endswith("/messages"):
        return "anthropic"
    return "responses" if "/v1/responses" in path else "openai"


async def _send_error(send: Send, error: GatewayError, api: Api) -> None:
    if api == "anthropic":
        payload = anthropic.error_body(error.status, error.message)
    elif api == "responses":
        payload = responses_api.error_body(error.status, error.message, error.code)
    else:
        payload = {"error": {"code": error.code, "message": error.message, "type": error.code}}
    extra = []
    if isinstance(error, GatewayPausedError):
        extra.append((b"retry-after", str(max(1, math.ceil(error.retry_after_seconds))).encode()))
    if isinstance(error, GatewayRequestTimeoutError):
        # The rest of the body may still come: the connection cannot carry another request.
        extra.append((b"connection", b"close"))
    await _send_bytes(send, error.status, orjson.dumps(payload), "application/json", extra)
