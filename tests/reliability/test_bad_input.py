"""Bad input, end to end: nothing accepted that cannot be read back, every malformed request a 4xx.

Each test drives real components on loopback: ``fulgor serve`` (a SQLite file, the gateway mounted
in front of a scripted OpenAI-compatible upstream), the gateway on its own, the local engine, the
openai and anthropic SDKs, a PostgreSQL schema. What is asserted is what came back (statuses, error
shapes, what the store holds), never how long it took; where a server must give up on a stalled
body, it is configured with a short timeout and the test checks that it answered and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from fulgor import limits, semconv
from fulgor.errors import ValidationError
from fulgor.gateway import Gateway, GatewayConfig, create_gateway_app
from fulgor.net.asgi import ServerThread
from fulgor.server import BackgroundServer, ServerConfig, create_app
from fulgor.store import SyncStore
from fulgor.store.base import Store
from fulgor.store.client import StoreClient
from fulgor.store.sqlite import SqliteStore
from fulgor.testing import ScriptedOpenAIServer, ScriptedReply
from fulgor.training.rollouts import read_outcome
from fulgor.types import AttemptedRollout, RolloutRequest, Span

JSON = {"Content-Type": "application/json"}
START = 1_700_000_000.0


@dataclass
class Served:
    url: str
    upstream: ScriptedOpenAIServer
    store: SyncStore
    gateway: Gateway


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """``fulgor serve`` on a SQLite file with the gateway mounted in front of a scripted upstream."""
    with ScriptedOpenAIServer(default_reply=ScriptedReply(text="4")) as upstream:
        store = SqliteStore(tmp_path / "store.sqlite")
        gateway = create_gateway_app(store, [upstream.url])
        app = create_app(ServerConfig(store=store, gateway=gateway))
        with (
            BackgroundServer(app) as server,
            SyncStore(StoreClient(server.url, max_retries=0)) as client,
        ):
            yield Served(server.url, upstream, client, gateway)


def claim(store: SyncStore) -> AttemptedRollout:
    store.enqueue([RolloutRequest(input={"question": "2+2"})])
    (attempted,) = store.claim("w1")
    return attempted


def base_url(served: Served, attempted: AttemptedRollout) -> str:
    return f"{served.url}/r/{attempted.rollout_id}/{attempted.attempt.attempt_id}"


def nested(depth: int) -> Any:
    """A JSON value nested ``depth`` levels: ``{"a": {"a": ... "leaf"}}``."""
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def nested_list(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def deep_schema(levels: int) -> dict[str, Any]:
    """A JSON schema whose JSON nests ``levels`` deep (an object property per two levels)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def until(condition: Callable[[], bool], timeout_seconds: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def otlp_document(attempted: AttemptedRollout, name: str, value: str) -> str:
    """An OTLP/JSON export of one span attributed to ``attempted``, with one attribute whose
    ``AnyValue`` is the JSON text ``value`` (written as text: nested values may be too deep for
    Python's JSON encoder)."""
    ids = [
        {"key": semconv.RESOURCE_ROLLOUT_ID, "value": {"stringValue": attempted.rollout_id}},
        {"key": semconv.RESOURCE_ATTEMPT_ID, "value": {"stringValue": attempted.attempt.attempt_id}},
    ]
    span = {
        "traceId": "ab" * 16,
        "spanId": name.encode().hex()[:16].ljust(16, "0"),
        "name": name,
        "startTimeUnixNano": "1700000000000000000",
        "attributes": [{"key": "value", "value": "VALUE"}],
    }
    document = {"resourceSpans": [{"resource": {"attributes": ids}, "scopeSpans": [{"spans": [span]}]}]}
    return json.dumps(document).replace('"VALUE"', value)


def array_values(depth: int) -> str:
    """An OTLP ``AnyValue`` holding a string inside ``depth`` nested arrays."""
    return '{"arrayValue":{"values":[' * depth + '{"stringValue":"leaf"}' + "]}}" * depth


# -- what is stored reads back ----------------------------------------------------------------------


def test_an_otlp_span_nested_250_levels_is_refused_and_its_rollout_still_reads(served: Served) -> None:
    attempted = claim(served.store)

    deep = httpx.post(
        f"{served.url}/v1/traces", content=otlp_document(attempted, "deep", array_values(250)), headers=JSON
    )
    shallow = httpx.post(
        f"{served.url}/v1/traces", content=otlp_document(attempted, "shallow", array_values(20)), headers=JSON
    )

    assert deep.status_code == 400
    assert deep.json()["error"]["code"] == "validation_error"
    assert (shallow.status_code, shallow.json()) == (200, {})
    spans = served.store.query_spans(attempted.rollout_id)
    assert [span.name for span in spans] == ["shallow"]
    assert spans[0].attributes["value"] == nested_list(20)


def test_a_call_whose_tool_schema_nests_240_levels_is_refused_before_it_goes_upstream(
    served: Served,
) -> None:
    attempted = claim(served.store)
    chat = openai.OpenAI(base_url=f"{base_url(served, attempted)}/v1", api_key="k", max_retries=0)
    messages = anthropic.Anthropic(base_url=base_url(served, attempted), api_key="k", max_retries=0)
    question = [{"role": "user", "content": "2+2?"}]
    schema = deep_schema(240)

    with pytest.raises(openai.BadRequestError) as refused:
        chat.chat.completions.create(
            model="m",
            messages=question,  # type: ignore[arg-type]
            tools=[{"type": "function", "function": {"name": "deep", "parameters": schema}}],
        )
    with pytest.raises(anthropic.BadRequestError) as refused_too:
        messages.messages.create(
            model="m",
            max_tokens=8,
            messages=question,  # type: ignore[arg-type]
            tools=[{"name": "deep", "input_schema": schema}],  # type: ignore[list-item]
        )
    answered = chat.chat.completions.create(model="m", messages=question)  # type: ignore[arg-type]

    assert "MAX_JSON_DEPTH" in refused.value.message
    assert refused.value.body["code"] == "invalid_request"  # type: ignore[index]
    assert "MAX_JSON_DEPTH" in refused_too.value.message
    assert refused_too.value.response.json()["type"] == "error"
    assert answered.choices[0].message.content == "4"
    assert len(served.upstream.requests) == 1  # only the call that could be recorded went upstream
    until(lambda: len(served.store.query_spans(attempted.rollout_id)) == 1)
    spans = served.store.query_spans(attempted.rollout_id, name=semconv.SPAN_MODEL_CALL)
    assert (len(spans), spans.spans_unreadable) == (1, 0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backend_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    store: Store
    if request.param == "sqlite":
        store = SqliteStore(tmp_path / "store.sqlite")
    else:
        from tests.unit.store.pgtools import open_postgres_store

        store = await open_postgres_store(tmp_path, time.time)
    yield store
    await store.close()


def store_span(attempted: AttemptedRollout, **fields: Any) -> Span:
    values: dict[str, Any] = {
        "rollout_id": attempted.rollout_id,
        "attempt_id": attempted.attempt.attempt_id,
        "trace_id": "t" * 32,
        "span_id": f"s-{time.monotonic_ns()}",
        "name": "step",
        "start_time": START,
    }
    values.update(fields)
    if "rollout_id" in fields:  # an id the test wants the store, not pydantic, to refuse
        return Span.model_construct(**values)
    return Span(**values)


async def test_every_backend_refuses_writes_past_a_limit_and_names_it(backend_store: Store) -> None:
    store = backend_store
    await store.enqueue([RolloutRequest(input=1)])
    (attempted,) = await store.claim("w1")
    await store.add_spans([store_span(attempted)])
    rollout_id, attempt_id = attempted.rollout_id, attempted.attempt.attempt_id
    too_big = {"x": "x" * limits.MAX_SPAN_ATTRIBUTES_BYTES}
    writes: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("MAX_JSON_DEPTH", lambda: store.add_spans([store_span(attempted, attributes={"x": nested(150)})])),
        ("MAX_JSON_DEPTH", lambda: store.add_spans([store_span(attempted, resource={"x": nested(150)})])),
        ("MAX_JSON_DEPTH", lambda: store.enqueue([RolloutRequest(input=nested(150))])),
        ("MAX_JSON_DEPTH", lambda: store.update_attempt(rollout_id, attempt_id, metadata={"m": nested(150)})),
        (
            "MAX_SPAN_ATTRIBUTES_BYTES",
            lambda: store.add_spans([store_span(attempted, attributes={"x": too_big})]),
        ),
        ("MAX_ID_CHARS", lambda: store.add_spans([store_span(attempted, rollout_id="r" * 1000)])),
        ("MAX_ID_CHARS", lambda: store.cancel(["r" * 1000])),
        # Text no database can store (a lone surrogate), refused like NUL characters in ids.
        ("not valid Unicode", lambda: store.add_spans([store_span(attempted, attributes={"x": "\ud800"})])),
    ]

    for limit, write in writes:
        with pytest.raises(ValidationError, match=limit):
            await write()

    spans = await store.query_spans(rollout_id)
    assert (len(spans), spans.spans_unreadable) == (1, 0)
    assert (await store.stats()).rollouts == {"running": 1}


def test_the_server_refuses_writes_past_a_limit_that_skip_the_client(served: Served) -> None:
    # Raw HTTP: the StoreClient checks the same limits before it sends anything.
    attempted = claim(served.store)
    span = json.loads(store_span(attempted).model_dump_json())
    deep = {**span, "span_id": "deep", "attributes": {"x": nested(150)}}
    big = {**span, "span_id": "big", "attributes": {"x": "x" * (limits.MAX_SPAN_ATTRIBUTES_BYTES + 1)}}

    for bad, limit in [(deep, "MAX_JSON_DEPTH"), (big, "MAX_SPAN_ATTRIBUTES_BYTES")]:
        answer = httpx.post(f"{served.url}/api/v1/spans", json={"spans": [bad]}, timeout=60)
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "validation_error"
        assert limit in answer.json()["error"]["message"]
    deep_input = httpx.post(f"{served.url}/api/v1/rollouts", json={"requests": [{"input": nested(150)}]})
    assert (deep_input.status_code, deep_input.json()["error"]["code"]) == (400, "validation_error")
    assert served.store.query_spans(attempted.rollout_id) == []
    assert served.store.stats().rollouts == {"preparing": 1}


# -- malformed requests are 4xx in their route's error shape -----------------------------------------


def test_malformed_otlp_bodies_are_400s_and_the_connection_stays_open(served: Served) -> None:
    attempted = claim(served.store)
    host, port = served.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    bodies = [
        b'{"resourceSpans":[5]}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":5}]}]}]}',
        b'{"resourceSpans":{"scopeSpans":[]}}',
        b'{"resourceSpans":[{"resource":{"attributes":[{"key":1}]}}]}',
    ]
    sockets = set()
    for body in bodies:
        connection.request("POST", "/v1/traces", body=body, headers=JSON)
        answer = connection.getresponse()
        error = json.loads(answer.read())["error"]
        assert (answer.status, error["code"]) == (400, "validation_error"), error
        assert "OTLP/JSON" in error["message"]
        assert answer.getheader("connection") != "close"
        sockets.add(id(connection.sock))
    connection.request(
        "POST", "/v1/traces", body=otlp_document(attempted, "ok", '{"intValue":"1"}'), headers=JSON
    )
    answer = connection.getresponse()
    assert (answer.status, json.loads(answer.read())) == (200, {})
    assert len(sockets | {id(connection.sock)}) == 1  # every answer came on the one connection
    connection.close()


def test_the_gateway_refuses_a_body_past_its_limit_with_413_in_the_callers_shape(served: Served) -> None:
    attempted = claim(served.store)
    huge = "word " * (limits.MAX_MODEL_CALL_BODY_BYTES // 5 + 1)
    chat = openai.OpenAI(base_url=f"{base_url(served, attempted)}/v1", api_key="k", max_retries=0)
    messages = anthropic.Anthropic(base_url=base_url(served, attempted), api_key="k", max_retries=0)

    with pytest.raises(openai.APIStatusError) as refused:
        chat.chat.completions.create(model="m", messages=[{"role": "user", "content": huge}])
    with pytest.raises(anthropic.APIStatusError) as refused_too:
        messages.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": huge}])

    assert refused.value.status_code == 413
    assert refused.value.body["code"] == "payload_too_large"  # type: ignore[index]
    assert "GatewayConfig.max_body_bytes" in refused.value.message
    assert refused_too.value.status_code == 413
    assert refused_too.value.response.json()["error"]["type"] == "request_too_large"
    assert served.upstream.requests == []
    assert served.gateway.state()["recorder"]["written"] == 0


def stalled_request(url: str, path: str) -> tuple[bytes, bool]:
    """Send a request whose body stops halfway; the status line of the answer (empty when none
    came), and whether the server then closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        # Generous: a server that never answers fails the test here rather than hanging it.
        sock.settimeout(20)
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        sock.sendall(head.encode() + b'Content-Length: 1000\r\n\r\n{"half": ')
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received.split(b"\r\n", 1)[0], False
        return received.split(b"\r\n", 1)[0], True


def test_a_body_that_stops_coming_is_answered_408_and_its_connection_closed(tmp_path: Path) -> None:
    with ScriptedOpenAIServer() as upstream:
        store = SqliteStore(tmp_path / "store.sqlite")
        short = GatewayConfig(body_timeout_seconds=0.2)
        mounted = create_gateway_app(store, [upstream.url], short)
        app = create_app(ServerConfig(store=store, gateway=mounted, body_timeout_seconds=0.2))
        alone = create_gateway_app(SqliteStore(tmp_path / "store.sqlite"), [upstream.url], short)
        with (
            BackgroundServer(app) as server,
            ServerThread(alone) as gateway_alone,
            SyncStore(StoreClient(server.url)) as client,
        ):
            attempted = claim(client)
            call = f"/r/{attempted.rollout_id}/{attempted.attempt.attempt_id}/v1/chat/completions"
            for url, path in [
                (server.url, "/api/v1/rollouts"),
                (server.url, "/v1/traces"),
                (server.url, call),
                (gateway_alone.url, call),
            ]:
                assert stalled_request(url, path) == (b"HTTP/1.1 408 Request Timeout", True), path
            assert client.stats().rollouts == {"preparing": 1}
        assert upstream.requests == []


def test_an_error_quotes_only_a_short_prefix_of_a_long_id(served: Served) -> None:
    attempted = claim(served.store)
    megabyte_id = "ro-" + "x" * 1_000_000
    long_id = "ro-" + "x" * 50_000  # a URL takes less than a megabyte

    answers = [
        httpx.post(f"{served.url}/api/v1/rollouts/cancel", json={"rollout_ids": [megabyte_id]}),
        httpx.post(
            f"{served.url}/api/v1/rollouts/wait", json={"rollout_ids": [megabyte_id], "timeout_seconds": 0}
        ),
        httpx.get(f"{served.url}/api/v1/rollouts/{long_id}"),
        httpx.post(f"{served.url}/r/{long_id}/at-1/v1/chat/completions", json={"messages": []}),
    ]
    otlp = httpx.post(
        f"{served.url}/v1/traces",
        content=otlp_document(attempted, "x", "{}").replace(attempted.rollout_id, megabyte_id),
        headers=JSON,
    )

    for answer in answers:
        assert answer.status_code == 400, answer.text[:200]
        assert len(answer.content) < 1000
        assert "MAX_ID_CHARS" in answer.text
    assert otlp.status_code == 200
    assert len(otlp.content) < 1000
    assert "MAX_ID_CHARS" in otlp.json()["partialSuccess"]["errorMessage"]
    unknown = httpx.get(f"{served.url}/api/v1/rollouts/ro-missing")
    assert (unknown.status_code, unknown.json()["error"]["message"]) == (
        404,
        "rollout 'ro-missing' not found",
    )


def test_validation_errors_are_400_across_the_server_and_its_spec(served: Served) -> None:
    attempted = claim(served.store)
    span = json.loads(store_span(attempted).model_dump_json())
    answers = {
        "a JSON type the schema refuses": httpx.post(
            f"{served.url}/api/v1/rollouts/claim", json={"worker_id": 5}
        ),
        "a query parameter": httpx.get(f"{served.url}/api/v1/rollouts", params={"limit": "-1"}),
        "a body that is no JSON": httpx.post(f"{served.url}/api/v1/rollouts", content=b"{", headers=JSON),
        "a model rule": httpx.post(
            f"{served.url}/api/v1/spans", json={"spans": [{**span, "end_time": START - 1}]}
        ),
        "a store rule": httpx.post(f"{served.url}/api/v1/rollouts/claim", json={"worker_id": "w\u0000"}),
        "a key too long": httpx.post(
            f"{served.url}/api/v1/rollouts/cancel",
            json={"rollout_ids": []},
            headers={"Idempotency-Key": "k" * 201},
        ),
    }

    for what, answer in answers.items():
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, "validation_error"), what
    with pytest.raises(ValidationError, match="status"):
        served.store.query_rollouts(status=["finished"])  # type: ignore[list-item]
    spec = httpx.get(f"{served.url}/openapi.json").json()
    statuses = {
        status for path in spec["paths"].values() for item in path.values() for status in item["responses"]
    }
    assert "400" in statuses
    assert "422" not in statuses


def test_a_big_real_request_passes_the_limits_with_room_to_spare(served: Served) -> None:
    """Thirty tools taking four levels of nested models (LangChain's own schemas, inlined) and a
    300-message conversation with tool calls: served, recorded and trained on."""
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import BaseModel

    class Address(BaseModel):
        street: str
        city: str
        tags: list[str]

    class Contact(BaseModel):
        name: str
        addresses: list[Address]

    class Team(BaseModel):
        members: list[Contact]
        lead: Contact

    class Organisation(BaseModel):
        """Save an organisation."""

        teams: list[Team]
        sites: list[list[Address]]

    tools = [convert_to_openai_tool(Organisation) for _ in range(30)]
    for index, tool in enumerate(tools):
        tool["function"]["name"] = f"save_{index}"
    history: list[Any] = [{"role": "system", "content": "You keep records. " * 50}]
    for turn in range(100):
        call = {"id": f"call-{turn}", "type": "function", "function": {"name": "save_0", "arguments": "{}"}}
        history += [
            {"role": "user", "content": f"Record team {turn}. " * 40},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call-{turn}", "content": "saved " * 40},
        ]
    attempted = claim(served.store)
    chat = openai.OpenAI(base_url=f"{base_url(served, attempted)}/v1", api_key="k", max_retries=0)

    answer = chat.chat.completions.create(model="m", messages=history, tools=tools)  # type: ignore[arg-type]
    served.store.add_spans(
        [
            store_span(
                attempted,
                name=semconv.SPAN_REWARD,
                attributes={semconv.ATTR_REWARD_VALUE: 1.0},
                span_id="reward",
            )
        ]
    )
    until(lambda: len(served.store.query_spans(attempted.rollout_id, name=semconv.SPAN_MODEL_CALL)) == 1)
    served.store.update_attempt(attempted.rollout_id, attempted.attempt.attempt_id, status="succeeded")
    outcome = asyncio.run(read_with_a_client(served.url, attempted.rollout_id))

    assert answer.choices[0].message.content == "4"
    assert outcome.trajectory is not None
    assert outcome.drift.spans_unreadable == 0
    sent = served.upstream.requests[-1]
    assert depth_of(sent) * 4 <= limits.MAX_JSON_DEPTH  # the limit leaves this request 4 times its depth
    assert len(json.dumps(sent)) * 10 <= limits.MAX_MODEL_CALL_BODY_BYTES


async def read_with_a_client(url: str, rollout_id: str) -> Any:
    client = StoreClient(url, max_retries=0)
    try:
        return await read_outcome(client, await client.get_rollout(rollout_id))
    finally:
        await client.close()


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(item) for item in value), default=0)
    return 0


# -- the engine ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from fulgor.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("engine") / "tiny", "tiny", seed=0)


@contextlib.contextmanager
def engine_server(model: Path, **options: Any) -> Iterator[str]:
    """The local engine's HTTP API on loopback, on its own engine."""
    from fulgor.engine.app import create_app as create_engine_app
    from fulgor.engine.local import EngineConfig, LocalEngine

    engine = LocalEngine.from_config(EngineConfig(model=model, device="cpu", max_model_len=512, seed=0))
    with ServerThread(create_engine_app(engine, **options)) as server:
        yield server.url


@pytest.mark.usefixtures("one_torch_thread")
def test_the_engine_answers_malformed_requests_with_400s_and_keeps_serving(engine_model: Path) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 2}
    malformed = {
        "a seed past 64 bits": {**chat, "seed": 2**70},
        "a lone surrogate": {**chat, "messages": [{"role": "user", "content": "\ud800"}]},
    }
    with engine_server(engine_model) as url:
        for what, body in malformed.items():
            answer = httpx.post(
                f"{url}/v1/chat/completions", content=json.dumps(body), headers=JSON, timeout=60
            )
            assert answer.status_code == 400, what
            assert answer.json()["error"]["type"] == "invalid_request_error", what
        served = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
        assert served.status_code == 200


@pytest.mark.usefixtures("one_torch_thread")
def test_the_engine_answers_a_body_that_stops_coming_with_408_and_closes(engine_model: Path) -> None:
    with engine_server(engine_model, body_timeout_seconds=0.2) as url:
        assert stalled_request(url, "/v1/chat/completions") == (b"HTTP/1.1 408 Request Timeout", True)
