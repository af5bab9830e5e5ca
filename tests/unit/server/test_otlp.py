"""OTLP/HTTP at /v1/traces: the real OpenTelemetry SDK exporter, OTLP/JSON, attribution, rejections."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.unit.server.served import TOKEN, claimed, served_store

from fulgor.errors import StoreUnavailableError
from fulgor.server import BackgroundServer, ServerConfig, create_app
from fulgor.store import SyncStore
from fulgor.store.memory import MemoryStore


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, SyncStore]]:
    with served_store(tmp_path) as served:
        yield served


def test_the_opentelemetry_sdk_exports_straight_to_the_store(served: tuple[str, SyncStore]) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="needs the frameworks extra")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Status, StatusCode

    url, store = served
    attempted = claimed(store)
    resource = Resource.create(
        {"fulgor.rollout_id": attempted.rollout_id, "fulgor.attempt_id": attempted.attempt.attempt_id}
    )
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"})
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("plan", attributes={"step": 1, "tags": ["a", "b"]}) as outer:
        outer.add_event("thought", {"text": "add them"})
        with tracer.start_as_current_span("tool") as inner:
            inner.set_status(Status(StatusCode.ERROR, "calculator down"))
    provider.shutdown()

    spans = {s.name: s for s in store.query_spans(attempted.rollout_id)}
    assert set(spans) == {"plan", "tool"}
    plan, tool = spans["plan"], spans["tool"]
    assert plan.attributes == {"step": 1, "tags": ["a", "b"]}
    assert plan.events[0].name == "thought"
    assert plan.events[0].attributes == {"text": "add them"}
    assert tool.parent_id == plan.span_id
    assert (len(plan.trace_id), len(plan.span_id)) == (32, 16)
    assert (tool.status.code, tool.status.message) == ("error", "calculator down")
    assert plan.resource["fulgor.rollout_id"] == attempted.rollout_id
    assert plan.end_time is not None
    assert plan.end_time >= plan.start_time
    assert store.get_rollout(attempted.rollout_id).status == "running"


def otlp_json(rollout_id: str | None = None, attempt_id: str | None = None) -> dict[str, Any]:
    resource = []
    if rollout_id is not None:
        resource = [
            {"key": "fulgor.rollout_id", "value": {"stringValue": rollout_id}},
            {"key": "fulgor.attempt_id", "value": {"stringValue": attempt_id}},
        ]
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "parentSpanId": "",
        "name": "fulgor.message",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001500000000",
        "attributes": [
            {"key": "n", "value": {"intValue": "42"}},
            {"key": "x", "value": {"doubleValue": 0.5}},
            {"key": "ok", "value": {"boolValue": True}},
            {
                "key": "kv",
                "value": {"kvlistValue": {"values": [{"key": "a", "value": {"stringValue": "b"}}]}},
            },
        ],
        "events": [{"name": "e", "timeUnixNano": "1700000000500000000"}],
        "status": {"code": 1},
    }
    return {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [{"spans": [span]}]}]}


def post(url: str, body: bytes, **headers: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", **headers}
    return httpx.post(f"{url}/v1/traces", content=body, headers=headers)


def test_otlp_json_with_resource_attributes(served: tuple[str, SyncStore]) -> None:
    url, store = served
    attempted = claimed(store)
    response = post(url, json.dumps(otlp_json(attempted.rollout_id, attempted.attempt.attempt_id)).encode())
    assert (response.status_code, response.json()) == (200, {})
    (span,) = store.query_spans(attempted.rollout_id)
    assert span.attributes == {"n": 42, "x": 0.5, "ok": True, "kv": {"a": "b"}}
    assert (span.start_time, span.end_time, span.parent_id) == (1_700_000_000.0, 1_700_000_001.5, None)
    assert (span.events[0].time, span.status.code) == (1_700_000_000.5, "ok")


def test_otlp_json_gzipped_with_header_attribution(served: tuple[str, SyncStore]) -> None:
    url, store = served
    attempted = claimed(store)
    body = gzip.compress(json.dumps(otlp_json()).encode())
    response = post(
        url,
        body,
        **{
            "Content-Encoding": "gzip",
            "X-Fulgor-Rollout-Id": attempted.rollout_id,
            "X-Fulgor-Attempt-Id": attempted.attempt.attempt_id,
        },
    )
    assert response.status_code == 200
    assert [s.name for s in store.query_spans(attempted.rollout_id)] == ["fulgor.message"]


def test_unattributed_and_unknown_spans_are_rejected_in_partial_success(
    served: tuple[str, SyncStore],
) -> None:
    url, store = served
    unattributed = post(url, json.dumps(otlp_json()).encode())
    assert unattributed.status_code == 200
    partial = unattributed.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "fulgor.rollout_id" in partial["errorMessage"]

    unknown = post(url, json.dumps(otlp_json("ro-missing", "at-missing")).encode())
    assert unknown.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert "not found" in unknown.json()["partialSuccess"]["errorMessage"]
    assert store.stats().spans == 0


def test_bad_otlp_bodies_get_error_bodies(served: tuple[str, SyncStore]) -> None:
    url, _ = served
    cases = [
        (post(url, b"hello", **{"Content-Type": "text/plain"}), 415, "unsupported_media_type"),
        (post(url, b"{not json"), 400, "validation_error"),
        (post(url, b"\xff\xff\xff", **{"Content-Type": "application/x-protobuf"}), 400, "validation_error"),
        (post(url, b"plain", **{"Content-Encoding": "gzip"}), 400, "validation_error"),
        (httpx.post(f"{url}/v1/traces", content=b"{}"), 401, "unauthorized"),
    ]
    for response, status, code in cases:
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), response.text


def test_a_bad_span_is_rejected_alone_and_non_finite_doubles_are_kept(served: tuple[str, SyncStore]) -> None:
    url, store = served
    attempted = claimed(store)
    document = otlp_json(attempted.rollout_id, attempted.attempt.attempt_id)
    good = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    spans = [
        good,
        {**good, "spanId": "01", "name": "huge", "startTimeUnixNano": "1" + "0" * 400},
        {**good, "spanId": "02", "name": "nul\u0000name"},
        {
            **good,
            "spanId": "03",
            "name": "doubles",
            "attributes": [
                {"key": "nan", "value": {"doubleValue": "NaN"}},
                {"key": "up", "value": {"doubleValue": "Infinity"}},
                {"key": "down", "value": {"doubleValue": "-Infinity"}},
            ],
        },
    ]
    document["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans

    response = post(url, json.dumps(document).encode())

    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "2"
    assert "spans[1]: a time of 1000" in partial["errorMessage"]
    assert "spans[2]: name must not contain NUL" in partial["errorMessage"]
    stored = {span.name: span for span in store.query_spans(attempted.rollout_id)}
    assert sorted(stored) == ["doubles", "fulgor.message"]
    assert stored["doubles"].attributes == {"nan": "NaN", "up": "Infinity", "down": "-Infinity"}


class _Down(MemoryStore):
    async def add_spans(self, spans: Any) -> Any:
        raise StoreUnavailableError("PostgreSQL at db:5432/fulgor failed: connection refused")


def test_an_unavailable_store_is_a_503_the_exporter_retries() -> None:
    with BackgroundServer(create_app(ServerConfig(store=_Down()))) as server:
        response = httpx.post(
            f"{server.url}/v1/traces",
            content=json.dumps(otlp_json("ro-1", "at-1")).encode(),
            headers={"Content-Type": "application/json"},
        )
    assert (response.status_code, response.json()["error"]["code"]) == (503, "store_unavailable")
