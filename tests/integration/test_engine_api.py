"""The local engine over real HTTP on loopback, driven by the official OpenAI SDK."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import torch  # noqa: E402
from tests.engine_support import ADD_TOOL, until  # noqa: E402

from fulgor.engine.app import create_app  # noqa: E402
from fulgor.engine.local import EngineConfig, LocalEngine  # noqa: E402
from fulgor.engine.models import init_model  # noqa: E402
from fulgor.engine.scheduler import Event, FinishEvent  # noqa: E402
from fulgor.net.asgi import ServerThread  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = "tiny"
TOOLS = [ADD_TOOL]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    model_dir = init_model(tmp_path_factory.mktemp("engine-api") / MODEL, "tiny", seed=0)
    return LocalEngine.from_config(EngineConfig(model=model_dir, device="cpu", max_model_len=512, seed=0))


@pytest.fixture(scope="module")
def url(engine: LocalEngine) -> Iterator[str]:
    with ServerThread(create_app(engine)) as server:
        yield server.url


@pytest.fixture(scope="module")
def client(url: str) -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _recomputed(engine: LocalEngine, prompt: list[int], output: list[int]) -> Any:
    with torch.no_grad():
        logits = engine.model.model(torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


def test_models_lists_the_served_model(client: Any) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] == 512
    assert models[0].model_extra["model_version"] == 0


def test_chat_returns_token_ids_and_logprobs_that_match_a_forward_pass(
    client: Any, engine: LocalEngine
) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    extra = response.model_extra
    choice = response.choices[0]
    prompt_ids, token_ids = extra["prompt_token_ids"], choice.model_extra["token_ids"]
    assert extra["model_version"] == 0
    assert engine.tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    assert len(token_ids) == response.usage.completion_tokens == len(choice.logprobs.content)
    assert response.usage.prompt_tokens == len(prompt_ids)
    returned = torch.tensor([entry.logprob for entry in choice.logprobs.content])
    assert torch.max(torch.abs(returned - _recomputed(engine, prompt_ids, token_ids))).item() <= 1e-4
    first = choice.logprobs.content[0]
    assert len(first.top_logprobs) == 3
    assert first.top_logprobs[0].logprob >= first.logprob - 1e-6


def test_completions_take_text_or_token_ids(client: Any, engine: LocalEngine) -> None:
    ids = engine.tokenizer.encode("The answer is", add_special_tokens=False)
    by_text = client.completions.create(
        model=MODEL,
        prompt="The answer is",
        max_tokens=6,
        temperature=0,
        logprobs=2,
        extra_body={"return_token_ids": True},
    )
    by_ids = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, temperature=0, extra_body={"return_token_ids": True}
    )
    first, second = by_text.choices[0], by_ids.choices[0]
    assert first.model_extra["prompt_token_ids"] == second.model_extra["prompt_token_ids"] == ids
    assert first.model_extra["token_ids"] == second.model_extra["token_ids"]
    assert first.text == second.text
    assert len(first.logprobs.token_logprobs) == len(first.model_extra["token_ids"])
    returned = torch.tensor(first.logprobs.token_logprobs)
    assert (
        torch.max(torch.abs(returned - _recomputed(engine, ids, first.model_extra["token_ids"]))).item()
        <= 1e-4
    )
    assert by_text.model_extra["model_version"] == 0


def test_n_and_seed(client: Any) -> None:
    def sample() -> list[str]:
        response = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            n=3,
            seed=11,
            temperature=1.0,
            top_p=0.95,
            extra_body={"return_token_ids": True},
        )
        assert [c.index for c in response.choices] == [0, 1, 2]
        return [json.dumps(c.model_extra["token_ids"]) for c in response.choices]

    first = sample()
    assert first == sample()
    assert len(set(first)) > 1


def test_stop_strings_cut_the_text(client: Any) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 24,
        "seed": 5,
    }
    full = client.chat.completions.create(**request, extra_body={"ignore_eos": True})
    text = full.choices[0].message.content
    stop = next(text[i : i + 3] for i in range(6, len(text) - 3) if "\ufffd" not in text[i : i + 3])
    cut = client.chat.completions.create(**request, stop=["never said", stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert full.choices[0].model_extra["stop_reason"] is None  # ended at its length limit
    assert cut.choices[0].model_extra["stop_reason"] == stop

    chunks = list(client.chat.completions.create(**request, stop=["never said", stop], stream=True))
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [(c.finish_reason, c.model_extra["stop_reason"]) for c in finishing] == [("stop", stop)]
    assert all("stop_reason" not in c.choices[0].model_extra for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text[: text.index(stop)]


def test_stop_token_ids_end_the_choice_and_are_named_as_its_stop_reason(
    client: Any, engine: LocalEngine, url: str
) -> None:
    request: dict[str, Any] = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 16, "seed": 5}
    options = {"ignore_eos": True, "return_token_ids": True}
    full = client.completions.create(**request, extra_body=options).choices[0]
    ids = full.model_extra["token_ids"]
    assert (full.finish_reason, full.model_extra["stop_reason"]) == ("length", None)
    at = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])

    stopped = client.completions.create(**request, extra_body={**options, "stop_token_ids": [ids[at]]})
    choice = stopped.choices[0]
    assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("stop", ids[at])
    # As in vLLM, the stop token stays in the token ids but adds no text.
    assert choice.model_extra["token_ids"] == ids[: at + 1]
    assert choice.text == engine.tokenizer.decode(ids[:at], skip_special_tokens=True)

    stream = client.completions.create(
        **request, stream=True, extra_body={**options, "stop_token_ids": [ids[at]]}
    )
    chunks = [c.choices[0] for c in stream]
    assert [c.model_extra["stop_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [ids[at]]
    assert chunks[-1].finish_reason == "stop"
    assert [i for c in chunks for i in c.model_extra.get("token_ids") or []] == ids[: at + 1]
    assert "".join(c.text for c in chunks) == choice.text

    bad = _post(url, "/v1/completions", {**request, "stop_token_ids": [-1]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "stop_token_ids"


def test_streaming_chat_matches_the_unstreamed_response(client: Any) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something"}],
        "max_tokens": 10,
        "temperature": 0,
        "extra_body": {"return_token_ids": True, "ignore_eos": True},
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = [i for c in chunks if c.choices for i in c.choices[0].model_extra.get("token_ids") or []]
    assert content == whole.choices[0].message.content
    assert ids == whole.choices[0].model_extra["token_ids"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.model_extra["model_version"] == 0 for c in chunks)


def test_streaming_completion(client: Any) -> None:
    stream = client.completions.create(
        model=MODEL,
        prompt="The answer is",
        max_tokens=6,
        temperature=0,
        stream=True,
        logprobs=1,
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    whole = client.completions.create(model=MODEL, prompt="The answer is", max_tokens=6, temperature=0)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert sum(len(c.choices[0].model_extra.get("token_ids") or []) for c in chunks) == 6
    assert chunks[0].choices[0].model_extra["prompt_token_ids"]


def test_streamed_completions_end_with_the_usage_when_asked(client: Any) -> None:
    request: dict[str, Any] = {"model": MODEL, "prompt": "The answer is", "max_tokens": 5, "n": 2}
    whole = client.completions.create(**request, extra_body={"ignore_eos": True})
    chunks = list(
        client.completions.create(
            **request, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    usage = whole.usage
    assert (usage.completion_tokens, usage.total_tokens) == (10, usage.prompt_tokens + 10)
    assert all(c.usage is None for c in chunks[:-1])
    without = list(client.completions.create(**request, stream=True, extra_body={"ignore_eos": True}))
    assert all(c.choices and c.usage is None for c in without)


def test_tools_and_tool_results_reach_the_prompt(client: Any, engine: LocalEngine) -> None:
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    response = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, extra_body={"return_token_ids": True}
    )
    prompt = engine.tokenizer.decode(response.model_extra["prompt_token_ids"])
    assert '<tools>\n{"name": "add"' in prompt
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>' in prompt
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>" in prompt


def _post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


def test_bad_input_gets_a_clear_400_and_the_engine_keeps_serving(url: str, client: Any) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        ({**chat, "model": "gpt-9"}, "model_not_found", "gpt-9"),
        ({**chat, "max_tokens": 1000}, "context_length_exceeded", "512"),
        (
            {**chat, "messages": [{"role": "user", "content": "word " * 300}]},
            "context_length_exceeded",
            "512",
        ),
        ({**chat, "temperature": -1}, "invalid_parameter", "temperature"),
        ({**chat, "top_p": 0}, "invalid_parameter", "top_p"),
        ({**chat, "n": 0}, "invalid_parameter", "n"),
        ({**chat, "max_tokens": 0}, "invalid_parameter", "max_tokens"),
        ({**chat, "presence_penalty": 1.0}, "invalid_parameter", "presence_penalty"),
        ({**chat, "messages": []}, "invalid_parameter", "messages"),
        ({**chat, "messages": [{"role": "wizard", "content": "x"}]}, "invalid_parameter", "role"),
        ({"messages": chat["messages"]}, "invalid_parameter", "model"),
    ]
    for body, code, mentioned in cases:
        response = _post(url, "/v1/chat/completions", body)
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert error["code"] == code, error
        assert mentioned in error["message"], error
        assert error["type"] == "invalid_request_error"
    bad_completions = [
        ({"model": MODEL, "prompt": [999999]}, "prompt token ids"),
        ({"model": MODEL, "prompt": ""}, "empty"),
        ({"model": MODEL, "prompt": "x", "echo": True}, "echo"),
    ]
    for body, mentioned in bad_completions:
        response = _post(url, "/v1/completions", body)
        assert response.status_code == 400
        assert mentioned in response.json()["error"]["message"]
    invalid_json = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", timeout=30)
    assert invalid_json.status_code == 400
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-9", messages=chat["messages"])
    assert client.chat.completions.create(model=MODEL, messages=chat["messages"], max_tokens=2).choices


def test_a_prompt_far_beyond_the_context_is_refused_without_tokenising_it(
    url: str, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Megabytes of text name both numbers in a 400, and the tokenizer never sees them."""
    encoded: list[int] = []
    encode = engine.tokenizer.encode
    monkeypatch.setattr(
        engine.tokenizer, "encode", lambda text, **kw: encoded.append(len(text)) or encode(text, **kw)
    )
    huge = "seven " * 1_000_000
    for path, body in (
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": huge}]}),
        ("/v1/completions", {"model": MODEL, "prompt": huge}),
    ):
        response = _post(url, path, body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert "maximum context length is 512 tokens, but the prompt has at least" in error["message"]
    assert all(size < 1_000_000 for size in encoded)


def test_image_and_audio_content_parts_are_refused(url: str, client: Any) -> None:
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]
    for part in parts:
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [part]}]}
        response = _post(url, "/v1/chat/completions", body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "invalid_parameter",
            "messages.0.content",
        )
        assert f"content parts of type '{part['type']}' are not supported" in error["message"]
        assert "text only" in error["message"]
    as_parts = [
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}
    ]
    as_text = [{"role": "user", "content": "hi there"}]
    prompts = [
        client.chat.completions.create(
            model=MODEL, messages=m, max_tokens=1, extra_body={"return_token_ids": True}
        ).model_extra["prompt_token_ids"]
        for m in (as_parts, as_text)
    ]
    assert prompts[0] == prompts[1]


def test_unknown_paths_and_methods_get_openai_errors(url: str) -> None:
    for method, path in [("POST", "/v1/responses"), ("GET", "/v1/models/tiny")]:
        response = httpx.request(method, f"{url}{path}", json={}, timeout=30)
        assert response.status_code == 404
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "not_found", None)
        assert f"no endpoint {method} {path}" in error["message"]
        assert "POST /v1/chat/completions" in error["message"]
    response = httpx.get(f"{url}/v1/chat/completions", timeout=30)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "method_not_allowed")
    assert "takes POST" in error["message"]


def test_a_forced_tool_choice_is_refused_with_what_is_supported(url: str, client: Any) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": TOOLS}
    for choice in ["required", {"type": "function", "function": {"name": "add"}}]:
        response = _post(url, "/v1/chat/completions", {**chat, "tool_choice": choice})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "tool_choice"
        assert f"{json.dumps(choice)} is not supported" in error["message"]
        assert 'takes tool_choice "auto"' in error["message"]
        assert '"none"' in error["message"]
        assert "Value error" not in error["message"]
    for choice in ["auto", "none"]:
        assert _post(url, "/v1/chat/completions", {**chat, "tool_choice": choice}).status_code == 200


DISCONNECTING = pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Count"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count"}]}),
    ],
)


def generation_ends(engine: LocalEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How each generation the engine starts from now on ends: ``finished`` or ``cancelled``."""
    ends: list[str] = []
    generate = engine.generate

    async def watched(*args: Any, **kwargs: Any) -> AsyncIterator[tuple[int, Event]]:
        finished = False
        try:
            async for index, event in generate(*args, **kwargs):
                finished = finished or isinstance(event, FinishEvent)
                yield index, event
        finally:
            ends.append("finished" if finished else "cancelled")

    monkeypatch.setattr(engine, "generate", watched)
    return ends


@DISCONNECTING
async def test_a_whole_answer_stops_generating_when_its_client_disconnects(
    url: str, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    ends = generation_ends(engine, monkeypatch)
    request = {"model": MODEL, "max_tokens": 400, "ignore_eos": True, **body}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        call = asyncio.create_task(http.post(path, json=request))
        await until(lambda: engine.stats()["running"] == 1)
        call.cancel()  # the caller goes away: the connection closes
        with contextlib.suppress(asyncio.CancelledError):
            await call
    await until(lambda: bool(ends))
    assert ends == ["cancelled"]
    await until(lambda: engine.stats()["running"] == 0, timeout_seconds=2)


@DISCONNECTING
async def test_a_stream_stops_generating_when_its_client_disconnects(
    url: str, engine: LocalEngine, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    ends = generation_ends(engine, monkeypatch)
    request = {"model": MODEL, "max_tokens": 400, "ignore_eos": True, "stream": True, **body}
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as http,
        http.stream("POST", path, json=request) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                break  # the first tokens arrived; the caller goes away: the connection closes
    await until(lambda: bool(ends))
    assert ends == ["cancelled"]
    await until(lambda: engine.stats()["running"] == 0, timeout_seconds=2)


def test_health(url: str) -> None:
    body = httpx.get(f"{url}/health").json()
    assert body["status"] == "ok"
    assert body["model"] == MODEL


async def _requests(url: str, concurrency: int, total: int, max_tokens: int) -> int:
    """Send ``total`` requests, ``concurrency`` at a time; the engine's forward passes they took."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def one() -> int:
            async with semaphore:
                response = await http.post("/v1/chat/completions", json=body)
                tokens: int = response.json()["usage"]["completion_tokens"]
                return tokens

        health = (await http.get("/health")).json()
        while health["running"] or health["waiting"]:  # an earlier test's generation, still ending
            await asyncio.sleep(0.05)
            health = (await http.get("/health")).json()
        before = health["forward_passes"]
        tokens = sum(await asyncio.gather(*(one() for _ in range(total))))
        after = (await http.get("/health")).json()["forward_passes"]
    assert tokens == total * max_tokens
    passes: int = after - before
    return passes


def test_sixteen_concurrent_requests_share_forward_passes(url: str) -> None:
    # One at a time, each request takes its own passes: a prefill, then a decode step per token.
    sequential = asyncio.run(_requests(url, concurrency=1, total=16, max_tokens=24))
    assert sequential == 16 * 24
    # Together they join the running batch: a third of the passes at most, however the requests
    # arrive (each arrival wave costs a prefill of its own, the decode steps are shared).
    concurrent = asyncio.run(_requests(url, concurrency=16, total=16, max_tokens=24))
    assert concurrent <= sequential // 3, (sequential, concurrent)
