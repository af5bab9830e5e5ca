"""ScriptedOpenAIServer: a real OpenAI-compatible HTTP server on loopback with scripted answers.

It speaks ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed
(server-sent events) or not, with tool calls, OpenAI ``logprobs`` and vLLM's token id fields:
with ``"return_token_ids": true`` a chat response carries ``prompt_token_ids`` at the top and
``token_ids`` on each choice (in a stream: ``prompt_token_ids`` on the first chunk, ``token_ids``
on every chunk), and a text completion carries both on each choice. Its "tokenizer" maps each
character to its code point, so ids are deterministic, and every choice it samples is kept in
:attr:`ScriptedOpenAIServer.samples`, so a test can compare what was recorded with what was sampled.

It answers in microseconds, which also makes it the "instant upstream" of the gateway benchmark.
Replies come from a queue (``script``), then from a ``responder`` (a function of the request body,
for a simulated model whose answer depends on what it is asked), then from ``default_reply``.
It runs on the caller's event loop (``async with``) or on a thread of its own (``with``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fulgor.net.http_server import HttpReply, HttpRequest, HttpServer, serve_http
from fulgor.testing._loop_thread import LoopThread

__all__ = ["Sample", "ScriptedOpenAIServer", "ScriptedReply", "ScriptedToolCall", "encode"]

JsonDict = dict[str, Any]

_ROUTES = "GET /v1/models, POST /v1/chat/completions and POST /v1/completions"
# (type, code) of OpenAI's error bodies where the status alone does not say it: a bad key, a rate limit.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    401: ("invalid_request_error", "invalid_api_key"),
    429: ("requests", "rate_limit_exceeded"),
}


def encode(text: str) -> list[int]:
    """The fake tokenizer: one token per character, its code point as the id."""
    return [ord(char) for char in text]


def _logprob(token_id: int) -> float:
    return -((token_id % 7) + 1) / 10


@dataclass(frozen=True)
class ScriptedToolCall:
    name: str
    arguments: JsonDict = field(default_factory=dict)


@dataclass(frozen=True)
class ScriptedReply:
    """What the server answers next: text, tool calls, or both."""

    text: str = "ok"
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    finish_reason: str | None = None

    def raw_text(self) -> str:
        """The text the model "sampled", tool calls included (what its token ids encode)."""
        calls = "".join(
            f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>"
            for c in self.tool_calls
        )
        return self.text + calls

    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


@dataclass(frozen=True)
class Sample:
    """One choice the server sampled: the ids a recorded model call must equal."""

    endpoint: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


class ScriptedOpenAIServer:
    """A scripted OpenAI-compatible server; see the module docstring."""

    def __init__(
        self,
        replies: Sequence[ScriptedReply] = (),
        *,
        default_reply: ScriptedReply | None = None,
        responder: Callable[[JsonDict], ScriptedReply] | None = None,
        supports_token_ids: bool = True,
        model: str = "scripted-model",
        model_version: int | None = None,
        token_delay_seconds: float = 0.0,
        delay_seconds: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.replies: deque[ScriptedReply] = deque(replies)
        self.default_reply = default_reply or ScriptedReply()
        self.responder = responder
        self.supports_token_ids = supports_token_ids
        self.model = model
        self.model_version = model_version
        self.token_delay_seconds = token_delay_seconds
        self.delay_seconds = delay_seconds
        self.samples: list[Sample] = []
        self.requests: list[JsonDict] = []
        self.request_headers: list[dict[str, str]] = []
        self.disconnects = 0
        self._failures: deque[int] = deque()
        self._ids = itertools.count(1)
        self._host = host
        self._port = port
        self._server: HttpServer | None = None
        self._thread = LoopThread("scripted-openai-server")

    # -- scripting --------------------------------------------------------------------------------

    def script(self, *replies: ScriptedReply) -> None:
        """Queue replies, answered in order before the default reply."""
        self.replies.extend(replies)

    def fail_next(self, count: int = 1, status: int = 503) -> None:
        """Answer the next ``count`` generation requests with an error status, in OpenAI's error
        body (429 as its rate limit, 5xx as ``server_error``)."""
        self._failures.extend([status] * count)

    @property
    def url(self) -> str:
        """The OpenAI base URL, ending in ``/v1``."""
        return f"http://{self._host}:{self.port}/v1"

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started; use `async with` or `with` first")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self._server = await serve_http(self._handle, self._host, self._port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> ScriptedOpenAIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> ScriptedOpenAIServer:
        self._thread.start(self.start, self.close)  # a taken port: raised here
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.stop(10)

    # -- protocol ---------------------------------------------------------------------------------

    async def _handle(self, request: HttpRequest) -> HttpReply:
        path = request.path.split("?", 1)[0]
        if request.method == "GET" and path == "/v1/models":
            data = [{"id": self.model, "object": "model", "created": 0, "owned_by": "fulgor"}]
            return _json({"object": "list", "data": data})
        if request.method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return _error(404, f"no route {request.method} {path}; this server serves {_ROUTES}")
        try:
            body = json.loads(request.body)
        except ValueError as error:
            return _error(400, f"the request body is not valid JSON ({error}); send a JSON object")
        if not isinstance(body, dict):
            return _error(400, f"the request body must be a JSON object, not {type(body).__name__}")
        self.requests.append(body)
        self.request_headers.append(request.headers)
        if self._failures:
            return _error(self._failures.popleft(), "scripted failure")
        if self.delay_seconds and await self._wait_or_disconnect(request, self.delay_seconds):
            return _error(499, "client went away")
        if path == "/v1/chat/completions":
            return self._chat(body, request)
        return self._completions(body, request)

    async def _wait_or_disconnect(self, request: HttpRequest, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if request.peer_closed():
                self.disconnects += 1
                return True
            await asyncio.sleep(0.01)
        return False

    def _next_reply(self, body: JsonDict) -> ScriptedReply:
        """The next queued reply; else the responder's answer to ``body``; else the default."""
        if self.replies:
            return self.replies.popleft()
        if self.responder is not None:
            return self.responder(body)
        return self.default_reply

    def _sample(self, endpoint: str, prompt_ids: list[int], reply: ScriptedReply) -> Sample:
        ids = encode(reply.raw_text())
        sample = Sample(endpoint, prompt_ids, ids, [_logprob(i) for i in ids])
        self.samples.append(sample)
        return sample

    def _envelope(self, kind: str, obj: str) -> JsonDict:
        """The fields every body (and every chunk of one stream: one id, one created) carries."""
        payload: JsonDict = {"id": f"{kind}-{next(self._ids)}", "object": obj, "created": int(time.time())}
        payload["model"] = self.model
        if self.model_version is not None:
            payload["model_version"] = self.model_version
        return payload

    def _wants_ids(self, body: JsonDict) -> bool:
        return self.supports_token_ids and bool(body.get("return_token_ids"))

    # -- chat -------------------------------------------------------------------------------------

    def _chat(self, body: JsonDict, request: HttpRequest) -> HttpReply:
        prompt_ids = encode(render_chat_prompt(body))
        replies = [self._next_reply(body) for _ in range(int(body.get("n") or 1))]
        samples = [self._sample("chat", prompt_ids, reply) for reply in replies]
        if body.get("stream"):
            return _sse(self._chat_stream(body, request, replies, samples))
        payload = self._envelope("chatcmpl", "chat.completion")
        payload["choices"] = [
            self._chat_choice(body, i, reply, sample)
            for i, (reply, sample) in enumerate(zip(replies, samples, strict=True))
        ]
        payload["usage"] = _usage(len(prompt_ids), sum(len(s.token_ids) for s in samples))
        if self._wants_ids(body):
            payload["prompt_token_ids"] = prompt_ids
        return _json(payload)

    def _chat_choice(self, body: JsonDict, index: int, reply: ScriptedReply, sample: Sample) -> JsonDict:
        message: JsonDict = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            request = len(self.requests) - 1
            message["tool_calls"] = [
                _tool_call(request, index, k, call) for k, call in enumerate(reply.tool_calls)
            ]
        choice: JsonDict = {"index": index, "message": message, "finish_reason": reply.finish()}
        choice["logprobs"] = _chat_logprobs(sample.token_ids) if body.get("logprobs") else None
        if self._wants_ids(body):
            choice["token_ids"] = sample.token_ids
        return choice

    async def _chat_stream(
        self, body: JsonDict, request: HttpRequest, replies: list[ScriptedReply], samples: list[Sample]
    ) -> AsyncIterator[bytes]:
        envelope = self._envelope("chatcmpl", "chat.completion.chunk")
        number = len(self.requests) - 1
        for index, (reply, sample) in enumerate(zip(replies, samples, strict=True)):
            first = dict(envelope, choices=[{"index": index, "delta": {"role": "assistant", "content": ""}}])
            if self._wants_ids(body):
                first["prompt_token_ids"] = sample.prompt_token_ids
            yield _event(first)
            for delta, ids in _chat_deltas(number, index, reply):
                if await self._paced(request):
                    return
                yield _event(self._chat_chunk(envelope, body, index, delta, ids, None))
            yield _event(self._chat_chunk(envelope, body, index, {}, [], reply.finish()))
        if (body.get("stream_options") or {}).get("include_usage"):
            tail = dict(envelope)
            prompt_tokens = len(samples[0].prompt_token_ids) if samples else 0
            tail.update(choices=[], usage=_usage(prompt_tokens, sum(len(s.token_ids) for s in samples)))
            yield _event(tail)
        yield b"data: [DONE]\n\n"

    def _chat_chunk(
        self,
        envelope: JsonDict,
        body: JsonDict,
        index: int,
        delta: JsonDict,
        ids: list[int],
        finish: str | None,
    ) -> JsonDict:
        chunk = dict(envelope)
        choice: JsonDict = {"index": index, "delta": delta, "finish_reason": finish}
        choice["logprobs"] = _chat_logprobs(ids) if body.get("logprobs") and ids else None
        if self._wants_ids(body):
            choice["token_ids"] = ids
        chunk["choices"] = [choice]
        return chunk

    async def _paced(self, request: HttpRequest) -> bool:
        """Sleep between tokens when asked to; True when the client has gone."""
        if not self.token_delay_seconds:
            return False
        return await self._wait_or_disconnect(request, self.token_delay_seconds)

    # -- completions ------------------------------------------------------------------------------

    def _completions(self, body: JsonDict, request: HttpRequest) -> HttpReply:
        prompts = _prompts(body.get("prompt", ""))
        per_prompt = int(body.get("n") or 1)
        replies = [self._next_reply(body) for _ in prompts for _ in range(per_prompt)]
        samples = [
            self._sample("completions", prompts[i // per_prompt], reply) for i, reply in enumerate(replies)
        ]
        # A text completion has no tool calls to finish with: "stop" unless the script says otherwise.
        finishes = [reply.finish_reason or "stop" for reply in replies]
        if body.get("stream"):
            return _sse(self._completion_stream(body, request, samples, finishes))
        payload = self._envelope("cmpl", "text_completion")
        payload["choices"] = [
            self._completion_choice(body, i, s, s.token_ids, finish)
            for i, (s, finish) in enumerate(zip(samples, finishes, strict=True))
        ]
        # Each prompt counts once, however many choices it was sampled for (as OpenAI and vLLM count).
        payload["usage"] = _usage(sum(map(len, prompts)), sum(len(s.token_ids) for s in samples))
        return _json(payload)

    def _completion_choice(
        self,
        body: JsonDict,
        index: int,
        sample: Sample,
        ids: list[int],
        finish: str | None,
        first: bool = True,
    ) -> JsonDict:
        choice: JsonDict = {"index": index, "text": "".join(map(chr, ids)), "finish_reason": finish}
        choice["logprobs"] = _completion_logprobs(ids) if body.get("logprobs") is not None else None
        if self._wants_ids(body):
            if first:
                choice["prompt_token_ids"] = sample.prompt_token_ids
            choice["token_ids"] = ids
        return choice

    async def _completion_stream(
        self, body: JsonDict, request: HttpRequest, samples: list[Sample], finishes: list[str]
    ) -> AsyncIterator[bytes]:
        envelope = self._envelope("cmpl", "text_completion")
        for index, (sample, finish) in enumerate(zip(samples, finishes, strict=True)):
            for position, token_id in enumerate(sample.token_ids):
                if await self._paced(request):
                    return
                choice = self._completion_choice(body, index, sample, [token_id], None, position == 0)
                yield _event(dict(envelope, choices=[choice]))
            last = self._completion_choice(body, index, sample, [], finish, not sample.token_ids)
            yield _event(dict(envelope, choices=[last]))
        yield b"data: [DONE]\n\n"


def render_chat_prompt(body: JsonDict) -> str:
    """The prompt text the fake "chat template" renders for a chat request."""
    parts = []
    for message in body.get("messages", []):
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        extra = json.dumps(message["tool_calls"], sort_keys=True) if message.get("tool_calls") else ""
        parts.append(f"<|{message.get('role')}|>{text or ''}{extra}")
    if body.get("tools"):
        parts.insert(0, f"<|tools|>{json.dumps(body['tools'], sort_keys=True)}")
    return "".join(parts) + "<|assistant|>"


def _prompts(prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [encode(prompt)]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return [encode(p) if isinstance(p, str) else list(p) for p in prompt]


def _chat_deltas(request: int, index: int, reply: ScriptedReply) -> list[tuple[JsonDict, list[int]]]:
    """The stream's deltas with the token ids each one carries: one per character of text, one per call."""
    deltas: list[tuple[JsonDict, list[int]]] = [({"content": char}, encode(char)) for char in reply.text]
    for k, call in enumerate(reply.tool_calls):
        raw = ScriptedReply(text="", tool_calls=(call,)).raw_text()
        deltas.append(({"tool_calls": [{"index": k, **_tool_call(request, index, k, call)}]}, encode(raw)))
    return deltas


def _tool_call(request: int, choice: int, index: int, call: ScriptedToolCall) -> JsonDict:
    """A tool call with an id of its own in the server's life (``call_REQUEST_CHOICE_INDEX``):
    agents match results to calls by id, across turns too."""
    function = {"name": call.name, "arguments": json.dumps(call.arguments)}
    return {"id": f"call_{request}_{choice}_{index}", "type": "function", "function": function}


def _chat_logprobs(ids: list[int]) -> JsonDict:
    content = [
        {"token": chr(i), "logprob": _logprob(i), "bytes": list(chr(i).encode()), "top_logprobs": []}
        for i in ids
    ]
    return {"content": content}


def _completion_logprobs(ids: list[int]) -> JsonDict:
    tokens = [chr(i) for i in ids]
    return {
        "tokens": tokens,
        "token_logprobs": [_logprob(i) for i in ids],
        "top_logprobs": None,
        "text_offset": [],
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> JsonDict:
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


def _error(status: int, message: str) -> HttpReply:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``, typed by status."""
    default = ("server_error" if status >= 500 else "invalid_request_error", None)
    kind, code = _ERROR_KINDS.get(status, default)
    return _json({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


def _json(payload: JsonDict, status: int = 200) -> HttpReply:
    return HttpReply(status=status, body=json.dumps(payload).encode())


def _sse(stream: AsyncIterator[bytes]) -> HttpReply:
    return HttpReply(content_type="text/event-stream", stream=stream, headers={"cache-control": "no-cache"})


def _event(payload: JsonDict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server in the foreground; prints its base URL (``--port 0`` picks a free port)."""
    parser = argparse.ArgumentParser(prog="python -m fulgor.testing.openai_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reply", default="ok", help="the text every request is answered with")
    args = parser.parse_args(argv)

    async def run() -> None:
        server = ScriptedOpenAIServer(
            default_reply=ScriptedReply(text=args.reply), host=args.host, port=args.port
        )
        async with server:
            print(server.url, flush=True)
            await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
