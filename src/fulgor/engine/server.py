"""The local engine's HTTP API: OpenAI-compatible endpoints, health, and the admin weight swap.

``create_app(engine)`` builds the FastAPI app; its lifespan starts and stops the engine's generation
thread. Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /health`` and ``POST /admin/weights`` (needs ``Authorization: Bearer <admin token>``).
Errors are ``{"error": {"message", "type", "code", "param"}}`` bodies; engine errors map to HTTP
statuses here and nowhere else.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fulgor.engine.errors import (
    AdminAuthError,
    AdminDisabledError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    UnknownModelError,
)
from fulgor.engine.local import LocalEngine
from fulgor.engine.prompts import chat_prompt_ids, completion_prompt_ids
from fulgor.engine.protocol import ChatCompletionRequest, CompletionRequest, WeightSwapRequest
from fulgor.engine.responses import ResponseContext, chat_choice, completion_choice, usage
from fulgor.engine.sampling import SamplingParams
from fulgor.engine.scheduler import FinishEvent
from fulgor.engine.streaming import chat_stream, completion_stream

__all__ = ["create_app", "error_body"]

logger = logging.getLogger(__name__)


def error_body(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
    kind = kinds.get(status, "server_error" if status >= 500 else "invalid_request_error")
    error = {"message": message, "type": kind, "code": code, "param": param}
    return JSONResponse({"error": error}, status_code=status)


def _status(error: EngineError) -> int:
    if isinstance(error, InvalidRequestError | ModelLoadError):
        return 400
    if isinstance(error, AdminDisabledError):
        return 403
    if isinstance(error, AdminAuthError):
        return 401
    return 503


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error.get("loc", ())[1:]) or "body"
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
        first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
        param = ".".join(str(p) for p in first[1:]) or None
        return error_body(400, "invalid_parameter", "invalid request: " + "; ".join(problems), param)

    @app.exception_handler(EngineError)
    async def engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return error_body(_status(exc), exc.code, exc.message, getattr(exc, "param", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_body(500, "internal_error", f"the engine failed to serve this request: {exc}")


def _check_model(engine: LocalEngine, requested: str) -> None:
    if requested != engine.model_name:
        raise UnknownModelError(requested, engine.model_name)


def _sampling_params(
    body: ChatCompletionRequest | CompletionRequest, max_tokens: int, top_logprobs: int
) -> list[SamplingParams]:
    """One set of parameters per choice; a seed gives choice i the seed ``seed + i``."""
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            stop=body.stop_strings,
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


async def _chat(engine: LocalEngine, body: ChatCompletionRequest) -> Response:
    _check_model(engine, body.model)
    prompt_ids = chat_prompt_ids(engine.tokenizer, body)
    max_tokens = engine.check_context(len(prompt_ids), body.max_output_tokens)
    params = _sampling_params(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else 0)
    ctx = ResponseContext(engine.tokenizer, engine.model_name, "chat", body.return_tokens_as_token_ids)
    if body.stream:
        stream = chat_stream(engine, ctx, body, prompt_ids, params)
        return StreamingResponse(stream, media_type="text/event-stream")
    events = await _finished(engine, prompt_ids, params)
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


async def _completions(engine: LocalEngine, body: CompletionRequest) -> Response:
    _check_model(engine, body.model)
    prompts = completion_prompt_ids(engine.tokenizer, body)
    limits = [engine.check_context(len(ids), body.max_tokens) for ids in prompts]
    top = body.logprobs or 0
    ctx = ResponseContext(engine.tokenizer, engine.model_name, "completion")
    if body.stream:
        if len(prompts) > 1:
            raise InvalidRequestError(
                "streaming takes one prompt per request; send the prompts separately", "prompt"
            )
        stream = completion_stream(engine, ctx, body, prompts[0], _sampling_params(body, limits[0], top))
        return StreamingResponse(stream, media_type="text/event-stream")
    runs = [
        _finished(engine, ids, _sampling_params(body, limit, top))
        for ids, limit in zip(prompts, limits, strict=True)
    ]
    per_prompt = await asyncio.gather(*runs)
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


def _openai_router(engine: LocalEngine) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": engine.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "fulgor",
            "root": str(engine.model.path),
            "max_model_len": engine.max_model_len,
            "model_version": engine.model_version,
        }
        return {"object": "list", "data": [card]}

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        return await _chat(engine, body)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        return await _completions(engine, body)

    @router.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": engine.model_name, **engine.stats()}

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


def _admin_router(engine: LocalEngine) -> APIRouter:
    router = APIRouter()

    @router.post("/admin/weights")
    async def swap_weights(body: WeightSwapRequest, authorization: str | None = Header(default=None)) -> Any:
        _authorize(engine.config.admin_token, authorization)
        swap = await engine.swap_weights(body.path)
        return {"model_version": swap.model_version, "path": str(swap.path), "kind": swap.kind}

    return router


def create_app(engine: LocalEngine) -> FastAPI:
    """The engine's FastAPI app; its lifespan starts and stops ``engine``."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="fulgor engine", lifespan=lifespan)
    _install_error_handlers(app)
    app.include_router(_openai_router(engine))
    app.include_router(_admin_router(engine))
    return app
