"""The local engine's HTTP API: OpenAI-compatible endpoints, health, and the admin weight swap.

``create_app(engine)`` builds the FastAPI app; its lifespan starts and stops the engine's generation
thread. Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /health`` and ``POST /admin/weights`` (needs ``Authorization: Bearer <admin token>``).
Every error answer, unknown paths and methods included, is an ``{"error": {"message", "type",
"code", "param"}}`` body; engine errors map to HTTP statuses here and nowhere else. A request body
is read whole before a route sees it: past ``max_body_bytes`` it gets 413, and one whose next part
takes longer than ``body_timeout_seconds`` gets 408 and a closed connection. A client that
disconnects before its whole (non-streamed) answer is ready cancels the generation, as a streaming
client does by going away.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

try:
    from fastapi import APIRouter, FastAPI, Header, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"the engine's HTTP API needs FastAPI ({error.name} is missing): pip install 'fulgor[server]'"
    ) from error

from fulgor import limits
from fulgor.engine.errors import (
    AdminAuthError,
    AdminDisabledError,
    EngineError,
    InvalidRequestError,
    UnknownModelError,
)
from fulgor.engine.local import LocalEngine
from fulgor.engine.output import ResponseContext, chat_choice, completion_choice, usage
from fulgor.engine.prompts import chat_prompt_ids, completion_prompt_ids
from fulgor.engine.protocol import ChatCompletionRequest, CompletionRequest, WeightSwapRequest
from fulgor.engine.sampling import SamplingParams
from fulgor.engine.scheduler import FinishEvent
from fulgor.engine.streaming import chat_stream, completion_stream
from fulgor.limits import quoted
from fulgor.net.request_body import (
    RequestIncompleteError,
    RequestTimeoutError,
    RequestTooLargeError,
    read_body,
)
from fulgor.weights.errors import ModelLoadError

__all__ = ["create_app", "error_body"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# nginx's "client closed request": nobody reads it, but the access log shows why the request ended.
_CLIENT_GONE = 499
_ENDPOINTS = (
    "GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /health, POST /admin/weights"
)


def error_body(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
    kind = kinds.get(status, "server_error" if status >= 500 else "invalid_request_error")
    error = {"message": message, "type": kind, "code": code, "param": param}
    return JSONResponse({"error": error}, status_code=status)


def _status(error: EngineError | ModelLoadError) -> int:
    if isinstance(error, InvalidRequestError | ModelLoadError):
        return 400
    if isinstance(error, AdminDisabledError):
        return 403
    if isinstance(error, AdminAuthError):
        return 401
    return 503


def _field(loc: Any) -> str:
    """A pydantic error location as a dotted path; a part that is the caller's text (a dict key) is
    quoted short when it is long."""
    return ".".join(quoted(str(part), bare=True) for part in loc[1:])


def _problem(error: Any) -> str:
    where = _field(error.get("loc", ())) or "body"
    cause = error.get("ctx", {}).get("error")
    # Our own validators' messages stand as written, without pydantic's "Value error, " prefix.
    message = str(cause) if error.get("type") == "value_error" and cause else error.get("msg", "invalid")
    return f"{where}: {message}"


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Unknown paths and methods, answered in the OpenAI error shape rather than Starlette's."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        code, message = "not_found", f"no endpoint {where}; this engine serves {_ENDPOINTS}"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        code, message = "method_not_allowed", f"{where} is not allowed; {request.url.path} takes {allowed}"
    else:
        code, message = "http_error", f"{where}: {exc.detail}"
    response = error_body(exc.status_code, code, message)
    response.headers.update(exc.headers or {})
    return response


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [_problem(error) for error in exc.errors()]
        first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
        param = _field(first) or None
        return error_body(400, "invalid_parameter", "invalid request: " + "; ".join(problems), param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _http_error(request, exc)

    @app.exception_handler(EngineError)
    @app.exception_handler(ModelLoadError)  # weights that do not load, in a swap
    async def engine_error(_: Request, exc: EngineError | ModelLoadError) -> JSONResponse:
        return error_body(_status(exc), exc.code, exc.message, getattr(exc, "param", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_body(
            500, "internal_error", f"the engine failed to serve this request: {quoted(str(exc))}"
        )


Served = dict[str, LocalEngine]
"""The engines an app serves, by model name: the model, then one per LoRA adapter."""


def _engine_for(served: Served, requested: str) -> LocalEngine:
    engine = served.get(requested)
    if engine is None:
        raise UnknownModelError(requested, ", ".join(served))
    return engine


def _stop_token_ids(engine: LocalEngine, body: ChatCompletionRequest | CompletionRequest) -> tuple[int, ...]:
    ids = tuple(body.stop_token_ids or ())
    vocab_size = len(engine.tokenizer)
    if any(i < 0 or i >= vocab_size for i in ids):
        raise InvalidRequestError(f"stop_token_ids must lie in [0, {vocab_size})", "stop_token_ids")
    return ids


def _sampling_params(
    engine: LocalEngine, body: ChatCompletionRequest | CompletionRequest, max_tokens: int, top_logprobs: int
) -> list[SamplingParams]:
    """One set of parameters per choice; a seed gives choice i the seed ``seed + i``."""
    stop_token_ids = _stop_token_ids(engine, body)
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            stop=body.stop_strings,
            stop_token_ids=stop_token_ids,
            seed=None if body.seed is None else body.seed + i,
            top_logprobs=top_logprobs,
            ignore_eos=body.ignore_eos,
        )
        for i in range(body.n)
    ]


async def _finished(
    engine: LocalEngine, prompt_ids: list[int], params: list[SamplingParams]
) -> list[FinishEvent]:
    results: dict[int, FinishEvent] = {}
    async for index, event in engine.generate(prompt_ids, params):
        if isinstance(event, FinishEvent):
            results[index] = event
    return [results[i] for i in range(len(params))]


async def _finished_prompts(
    engine: LocalEngine, prompts: list[list[int]], params: list[list[SamplingParams]]
) -> list[list[FinishEvent]]:
    runs = [_finished(engine, ids, p) for ids, p in zip(prompts, params, strict=True)]
    return await asyncio.gather(*runs)


async def _client_gone(request: Request) -> None:
    """Returns once the client has disconnected (the request body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_gone(request: Request, work: Coroutine[Any, Any, _T]) -> _T | None:
    """``work``'s result, or None once the client disconnects first, which cancels ``work``.

    Cancelling closes ``engine.generate``, which cancels its sequences: without this a whole answer
    nobody waits for would generate to max_tokens, holding a batch slot and delaying weight swaps,
    which wait for the running batch to drain. (Streams stop when their response can no longer be
    sent.)
    """
    job = asyncio.create_task(work)
    watcher = asyncio.create_task(_client_gone(request))
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        finished = job.done()
        job.cancel()
    if finished:
        return job.result()
    await asyncio.wait({job})  # let generate's cleanup run before the request ends
    logger.info("%s %s: the client disconnected; generation cancelled", request.method, request.url.path)
    return None


async def _chat(served: Served, request: Request, body: ChatCompletionRequest) -> Response:
    engine = _engine_for(served, body.model)
    prompt_ids = chat_prompt_ids(engine.tokenizer, body, engine.chat_format, engine.max_model_len)
    max_tokens = engine.check_context(len(prompt_ids), body.max_output_tokens)
    params = _sampling_params(engine, body, max_tokens, (body.top_logprobs or 0) if body.logprobs else 0)
    ctx = ResponseContext(
        engine.tokenizer, engine.model_name, "chat", body.return_tokens_as_token_ids, engine.chat_format
    )
    if body.stream:
        stream = chat_stream(engine, ctx, body, prompt_ids, params)
        return StreamingResponse(stream, media_type="text/event-stream")
    events = await _unless_client_gone(request, _finished(engine, prompt_ids, params))
    if events is None:
        return Response(status_code=_CLIENT_GONE)
    options = {
        "tools_active": body.tools_active,
        "logprobs": body.logprobs,
        "return_token_ids": bool(body.return_token_ids),
    }
    choices = [chat_choice(ctx, i, event, **options) for i, event in enumerate(events)]
    result = ctx.envelope("chat.completion", max(e.model_version for e in events))
    result.update(choices=choices, usage=usage(len(prompt_ids), sum(len(e.token_ids) for e in events)))
    if body.return_token_ids:
        result["prompt_token_ids"] = prompt_ids
    return JSONResponse(result)


async def _completions(served: Served, request: Request, body: CompletionRequest) -> Response:
    engine = _engine_for(served, body.model)
    prompts = completion_prompt_ids(engine.tokenizer, body, engine.max_model_len)
    limits = [engine.check_context(len(ids), body.max_tokens) for ids in prompts]
    top = body.logprobs or 0
    ctx = ResponseContext(engine.tokenizer, engine.model_name, "completion")
    if body.stream:
        if len(prompts) > 1:
            raise InvalidRequestError(
                "streaming takes one prompt per request; send the prompts separately", "prompt"
            )
        params = _sampling_params(engine, body, limits[0], top)
        stream = completion_stream(engine, ctx, body, prompts[0], params)
        return StreamingResponse(stream, media_type="text/event-stream")
    per_params = [_sampling_params(engine, body, limit, top) for limit in limits]
    per_prompt = await _unless_client_gone(request, _finished_prompts(engine, prompts, per_params))
    if per_prompt is None:
        return Response(status_code=_CLIENT_GONE)
    choices = []
    for j, (ids, events) in enumerate(zip(prompts, per_prompt, strict=True)):
        for i, event in enumerate(events):
            options = {"logprobs": body.logprobs is not None, "return_token_ids": bool(body.return_token_ids)}
            choices.append(completion_choice(ctx, j * body.n + i, event, ids, **options))
    version = max(event.model_version for events in per_prompt for event in events)
    completion_tokens = sum(len(e.token_ids) for events in per_prompt for e in events)
    result = ctx.envelope("text_completion", version)
    result.update(choices=choices, usage=usage(sum(len(ids) for ids in prompts), completion_tokens))
    return JSONResponse(result)


def _card(name: str, engine: LocalEngine) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "fulgor",
        "root": str(engine.model.path),
        "max_model_len": engine.max_model_len,
        "model_version": engine.model_version,
    }


def _openai_router(served: Served) -> APIRouter:
    router = APIRouter()
    engine = next(iter(served.values()))

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_card(name, each) for name, each in served.items()]}

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        return await _chat(served, request, body)

    @router.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        return await _completions(served, request, body)

    @router.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": engine.model_name, **engine.stats(), "models": list(served)}

    return router


def _authorize(expected: str | None, authorization: str | None) -> None:
    if expected is None:
        raise AdminDisabledError(
            "admin endpoints are disabled; start the engine with --admin-token-file FILE "
            "or the FULGOR_ENGINE_ADMIN_TOKEN environment variable"
        )
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise AdminAuthError("missing or wrong admin token; send Authorization: Bearer <admin token>")


def _admin_router(served: Served) -> APIRouter:
    router = APIRouter()
    engine = next(iter(served.values()))

    @router.post("/admin/weights")
    async def swap_weights(body: WeightSwapRequest, authorization: str | None = Header(default=None)) -> Any:
        _authorize(engine.config.admin_token, authorization)
        target = engine if body.model is None else _engine_for(served, body.model)
        swap = await target.swap_weights(body.path)
        return {"model_version": swap.model_version, "path": str(swap.path), "kind": swap.kind}

    return router


class _WholeBodies:
    """ASGI middleware: reads each request's body whole (at most ``max_body_bytes``, each part within
    ``timeout_seconds``) before the app sees it, then hands it over as one message. Starlette would
    wait for a stalled body as long as the connection stays open, and take any size."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, timeout_seconds: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.timeout_seconds = timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.max_body_bytes, self.timeout_seconds)
        except RequestIncompleteError:
            return  # nobody is left to answer
        except RequestTooLargeError:
            message = f"the request body is larger than {self.max_body_bytes} bytes, this engine's limit"
            await error_body(413, "payload_too_large", message)(scope, receive, send)
            return
        except RequestTimeoutError as error:
            response = error_body(408, error.code, error.message)
            response.headers["connection"] = "close"  # the rest of the body may still come
            await response(scope, receive, send)
            return
        if _LONE_SURROGATE.search(body) and not _is_text(body):
            # Python's JSON parser takes a lone surrogate escape, the tokenizer then fails on it.
            message = "the request body holds a lone surrogate (a \\ud800-\\udfff escape without its pair)"
            await error_body(400, "invalid_request", message)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or one of those not preceded by the first.
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _is_text(body: bytes) -> bool:
    """Whether a body the pattern flagged parses to text without lone surrogates (an escaped
    backslash before ``ud800`` is text, and so is a body that is no JSON at all: FastAPI says so)."""
    try:
        json.dumps(json.loads(body), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    except (ValueError, RecursionError):
        return True
    return True


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives ``body`` first, then what ``receive`` gives (the client's disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def create_app(
    engine: LocalEngine,
    *,
    adapters: Sequence[LocalEngine] = (),
    max_body_bytes: int = limits.MAX_BODY_BYTES,
    body_timeout_seconds: float = limits.BODY_TIMEOUT_SECONDS,
) -> FastAPI:
    """The engine's FastAPI app; its lifespan starts and stops ``engine``.

    ``adapters`` are engines serving the model with one LoRA adapter each (merged into a copy of
    its weights), each under its own model name: a request names the one it wants, and
    ``POST /admin/weights`` with ``"model"`` swaps that one's weights.
    """
    served: Served = {engine.model_name: engine}
    for each in adapters:
        if each.model_name in served:
            raise ValueError(f"two engines would serve the model name {each.model_name!r}")
        served[each.model_name] = each

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for each in served.values():
            each.start()
        try:
            yield
        finally:
            for each in served.values():
                await asyncio.to_thread(each.close)

    app = FastAPI(title="fulgor engine", lifespan=lifespan)
    app.add_middleware(_WholeBodies, max_body_bytes=max_body_bytes, timeout_seconds=body_timeout_seconds)
    _install_error_handlers(app)
    app.include_router(_openai_router(served))
    app.include_router(_admin_router(served))
    return app
