"""OTLP/HTTP trace ingestion: ``POST /v1/traces`` turns OpenTelemetry spans into store spans.

Any OpenTelemetry-instrumented agent can export straight to fulgor by pointing its OTLP/HTTP
exporter at ``http://HOST:PORT/v1/traces``. Bodies may be protobuf (``application/x-protobuf``,
needs ``opentelemetry-proto`` from the ``server`` extra) or OTLP/JSON (``application/json``: hex
trace and span ids, attributes as key/value ``AnyValue`` lists), optionally gzip-compressed.

Each span is attributed to a rollout and attempt by, in this order: its own attributes
``fulgor.rollout_id``/``fulgor.attempt_id``, its resource's attributes with the same keys, or the
request headers ``X-Fulgor-Rollout-Id``/``X-Fulgor-Attempt-Id``. Spans that cannot be attributed,
or name an unknown rollout or attempt, are reported back as OTLP ``partial_success`` rejections;
the others are stored. Protobuf is first converted to the OTLP/JSON shape, so one decoder reads both.

A body that cannot be decoded is refused whole with 400, as OTLP says: protobuf that does not
parse, or JSON whose shape is not OTLP/JSON's (:mod:`fulgor.server.otlp_json`: a span that is a
number, a name that is not a string, nesting past the JSON parser's limit). Each span of a body that
decodes is checked against the store's rules on its own, limits included (:mod:`fulgor.limits`),
so a bad one (a timestamp too large for a float, an id with a NUL character, attributes nested too
deep to read back) is rejected alone, with its reason, and the rest of its batch is stored.
Doubles that are NaN or infinite are legal OTLP but not JSON, and the store keeps JSON: they are
stored as the strings OTLP/JSON writes them as (``"NaN"``, ``"Infinity"``,
``"-Infinity"``), so the span is kept. A store whose database is unavailable fails the whole
request with 503, which OTLP exporters retry (spans already stored are not duplicated: the store
keeps one span per span id).
"""

from __future__ import annotations

import base64
import hmac
import json
import zlib
from collections.abc import Sequence
from typing import Any

import pydantic

from fulgor.credentials import is_attempt_credential
from fulgor.errors import NotFoundError, StoreError, StoreUnavailableError, ValidationError
from fulgor.limits import quoted
from fulgor.semconv import RESOURCE_ATTEMPT_ID, RESOURCE_ROLLOUT_ID, SPAN_MODEL_CALL
from fulgor.server.http import (
    JSON,
    Answer,
    AttemptEndedError,
    ForbiddenError,
    Receive,
    RequestTooLargeError,
    Scope,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    header,
    read_body,
)
from fulgor.server.otlp_json import OtlpExportTraceServiceRequest, OtlpExportTraceServiceResponse
from fulgor.server.routing import Route
from fulgor.store import _rules as rules
from fulgor.store import http_api as api
from fulgor.store.base import Store
from fulgor.types import Span, SpanEvent, SpanStatus

__all__ = ["decode_json", "decode_protobuf", "otlp_route", "spans_from_otlp"]

PROTOBUF = "application/x-protobuf"
_STATUS_CODES = {0: "unset", 1: "ok", 2: "error", "STATUS_CODE_UNSET": "unset", "STATUS_CODE_OK": "ok"}
_STATUS_CODES["STATUS_CODE_ERROR"] = "error"

Attribution = tuple[str | None, str | None]


def decode_json(body: bytes) -> dict[str, Any]:
    """An OTLP/JSON ``ExportTraceServiceRequest`` as a dict (keys in lowerCamelCase), checked against
    the shape OTLP/JSON gives it (:mod:`fulgor.server.otlp_json`): a body of another shape cannot be
    decoded, and is refused whole (ValidationError, a 400), as OTLP says."""
    try:
        request = OtlpExportTraceServiceRequest.model_validate_json(body, strict=True)
    except pydantic.ValidationError as error:
        raise ValidationError(
            f"body is not an OTLP/JSON ExportTraceServiceRequest: {_reason(error)}"
        ) from None
    document: dict[str, Any] = request.model_dump(by_alias=True, exclude_none=True)
    return document


def decode_protobuf(body: bytes) -> dict[str, Any]:
    """A protobuf ``ExportTraceServiceRequest`` in the OTLP/JSON shape (ids as hex)."""
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:
        raise UnsupportedMediaTypeError(
            "protobuf OTLP needs opentelemetry-proto: pip install 'fulgor[server]', or export OTLP/JSON"
        ) from None
    message = ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as error:
        raise ValidationError(f"body is not a protobuf ExportTraceServiceRequest: {error}") from None
    document: dict[str, Any] = MessageToDict(message, use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document


def spans_from_otlp(document: dict[str, Any], fallback: Attribution) -> tuple[list[Span], list[str]]:
    """Store spans from an OTLP/JSON document, and a reason for each span that was left out."""
    spans: list[Span] = []
    problems: list[str] = []
    for r, resource_spans in enumerate(_list(document, "resourceSpans", "resource_spans")):
        resource = _attributes(_object(resource_spans, "resource").get("attributes"))
        for s, scope_spans in enumerate(_list(resource_spans, "scopeSpans", "scope_spans")):
            for i, raw in enumerate(_list(scope_spans, "spans")):
                where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                try:
                    span = _span(raw, resource, fallback)
                    rules.check_spans([span])
                except (ValidationError, pydantic.ValidationError, TypeError, ValueError) as error:
                    # check_spans names the field as in a list of one ("spans[0].name"); where says which.
                    problems.append(f"{where}: {_reason(error).removeprefix('spans[0].')}")
                else:
                    spans.append(span)
    return spans, problems


def _span(raw: Any, resource: dict[str, Any], fallback: Attribution) -> Span:
    if not isinstance(raw, dict):
        raise ValidationError("a span must be an object")
    attributes = _attributes(raw.get("attributes"))
    rollout_id = attributes.get(RESOURCE_ROLLOUT_ID) or resource.get(RESOURCE_ROLLOUT_ID) or fallback[0]
    attempt_id = attributes.get(RESOURCE_ATTEMPT_ID) or resource.get(RESOURCE_ATTEMPT_ID) or fallback[1]
    if not rollout_id or not attempt_id:
        raise ValidationError(
            f"no rollout or attempt: set the resource attributes {RESOURCE_ROLLOUT_ID} and "
            f"{RESOURCE_ATTEMPT_ID}, or the headers {api.ROLLOUT_HEADER} and {api.ATTEMPT_HEADER}"
        )
    status = _object(raw, "status")
    parent = _get(raw, "parentSpanId", "parent_span_id")
    end = _get(raw, "endTimeUnixNano", "end_time_unix_nano")
    return Span(
        rollout_id=str(rollout_id),
        attempt_id=str(attempt_id),
        trace_id=str(_get(raw, "traceId", "trace_id") or ""),
        span_id=str(_get(raw, "spanId", "span_id") or ""),
        parent_id=str(parent) if parent else None,
        name=str(raw.get("name") or ""),
        start_time=_seconds(_get(raw, "startTimeUnixNano", "start_time_unix_nano")),
        end_time=_seconds(end) if end not in (None, "0", 0) else None,
        attributes=attributes,
        events=tuple(_event(event) for event in _list(raw, "events")),
        status=SpanStatus(
            code=_STATUS_CODES.get(status.get("code", 0), "unset"), message=status.get("message")
        ),
        resource=resource,
    )


def _event(raw: Any) -> SpanEvent:
    if not isinstance(raw, dict):
        raise ValidationError("a span event must be an object")
    return SpanEvent(
        name=str(raw.get("name") or ""),
        time=_seconds(_get(raw, "timeUnixNano", "time_unix_nano")),
        attributes=_attributes(raw.get("attributes")),
    )


def _attributes(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise ValidationError("attributes must be a list of {key, value} objects")
    result: dict[str, Any] = {}
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise ValidationError("attributes must be a list of {key, value} objects")
        result[item["key"]] = _any_value(item.get("value"))
    return result


def _any_value(raw: Any) -> Any:
    """An OTLP ``AnyValue`` as plain JSON data (bytes stay base64, as in OTLP/JSON)."""
    if not isinstance(raw, dict) or not raw:
        return None
    kind, value = next(iter(raw.items()))
    if kind in ("stringValue", "string_value", "bytesValue", "bytes_value"):
        return str(value)
    if kind in ("boolValue", "bool_value"):
        return bool(value)
    if kind in ("intValue", "int_value"):
        return int(value)
    if kind in ("doubleValue", "double_value"):
        return rules.json_float(float(value))
    if kind in ("arrayValue", "array_value"):
        return [_any_value(v) for v in _list(value, "values")]
    if kind in ("kvlistValue", "kvlist_value"):
        return _attributes(_list(value, "values"))
    raise ValidationError(f"unknown AnyValue kind {quoted(kind)}")


def _seconds(nanos: Any) -> float:
    if nanos is None:
        raise ValidationError("startTimeUnixNano and event timeUnixNano are required")
    try:
        return int(nanos) / 1e9
    except OverflowError:
        raise ValidationError(f"a time of {str(nanos)[:30]}... nanoseconds is out of range") from None


def _get(raw: dict[str, Any], camel: str, snake: str) -> Any:
    return raw.get(camel, raw.get(snake))


def _list(raw: Any, camel: str, snake: str | None = None) -> list[Any]:
    value = raw.get(camel, raw.get(snake or camel)) if isinstance(raw, dict) else None
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError(f"{camel} must be a list")
    return value


def _object(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(f"{key} must be an object")
    return value


def _reason(error: Exception) -> str:
    if isinstance(error, pydantic.ValidationError):
        return "; ".join(f"{api.field_path(tuple(e['loc']))}: {e['msg']}" for e in error.errors()[:3])
    return getattr(error, "message", str(error))


async def store_spans(store: Store, spans: Sequence[Span]) -> tuple[int, list[str]]:
    """Add spans one (rollout, attempt) group at a time, so one unknown id rejects only its group.

    Returns how many spans were rejected, and why.
    """
    groups: dict[tuple[str, str], list[Span]] = {}
    for span in spans:
        groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
    rejected, problems = 0, []
    for (rollout_id, attempt_id), group in groups.items():
        try:
            await store.add_spans(group)
        except StoreUnavailableError:
            raise  # nothing is wrong with the spans: a 503 makes the exporter send them again
        except (StoreError, ValidationError) as error:
            rejected += len(group)
            problems.append(f"{len(group)} span(s) of {rollout_id}/{attempt_id}: {error.message}")
    return rejected, problems


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise UnsupportedMediaTypeError(f"Content-Encoding {quoted(encoding)} is not supported; use gzip")
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise ValidationError(f"body is not valid gzip: {error}") from None
    if len(data) > limit:
        raise RequestTooLargeError(f"decompressed body is larger than {limit} bytes; export fewer spans")
    return data


def otlp_route(store: Store, max_body_bytes: int, operator_key: str | None = None) -> Route:
    """``POST /v1/traces``: the OTLP/HTTP trace endpoint, storing into ``store``.

    With an ``operator_key``, a request needs it (spans of any attempt) or an attempt's credential
    (:mod:`fulgor.credentials`): then only spans of that attempt, while it is live, and never a
    ``fulgor.model_call`` span (those come from the gateway alone); other spans are rejected.
    """

    async def export_traces(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        presented = None if operator_key is None else _bearer(scope, operator_key)
        content_type = (header(scope, b"content-type") or b"").decode("latin-1")
        content_type = content_type.split(";")[0].strip().lower()
        if content_type not in (PROTOBUF, JSON):
            raise UnsupportedMediaTypeError(
                f"Content-Type {quoted(content_type or '(none)')} is not OTLP; send {PROTOBUF} or {JSON}"
            )
        encoding = (header(scope, b"content-encoding") or b"").decode("latin-1")
        body = _decompress(await read_body(receive, max_body_bytes), encoding, max_body_bytes)
        document = decode_protobuf(body) if content_type == PROTOBUF else decode_json(body)
        fallback = (_text_header(scope, _ROLLOUT_HEADER), _text_header(scope, _ATTEMPT_HEADER))
        spans, problems = spans_from_otlp(document, fallback)
        if presented is not None:
            assert operator_key is not None
            spans, refused = await _own_spans(spans, operator_key, presented, store)
            problems += refused
        rejected, store_problems = await store_spans(store, spans)
        problems += store_problems
        return _export_response(content_type, problems, rejected + len(problems) - len(store_problems))

    return Route("POST", "/v1/traces", export_traces, scoped=operator_key is not None, operation=_OPENAPI)


def _bearer(scope: Scope, operator_key: str) -> bytes | None:
    """None for the operator's key; the bearer token sent otherwise (UnauthorizedError for none)."""
    given = header(scope, b"authorization")
    if given is None or given[:7].lower() != b"bearer ":
        raise UnauthorizedError(
            "OTLP export needs a bearer token: the credential the runner handed this agent (its "
            "OPENAI_API_KEY), or the run's operator key"
        )
    presented = given[7:].strip()
    return None if hmac.compare_digest(presented, operator_key.encode()) else presented


async def _own_spans(
    spans: list[Span], operator_key: str, presented: bytes, store: Store
) -> tuple[list[Span], list[str]]:
    """The spans an attempt's credential may write, and a reason for each one it may not."""
    kept: list[Span] = []
    problems: list[str] = []
    matched = False
    live: dict[tuple[str, str], bool] = {}  # asked once per attempt and request
    for span in spans:
        if not is_attempt_credential(operator_key, span.rollout_id, span.attempt_id, presented):
            problems.append(f"span {span.span_id[:64]!r}: the credential sent is not for its attempt")
            continue
        matched = True
        if span.name == SPAN_MODEL_CALL:
            problems.append(f"span {span.span_id[:64]!r}: {SPAN_MODEL_CALL} spans come from the gateway only")
        elif not await _memo(live, (span.rollout_id, span.attempt_id), store):
            problems.append(f"span {span.span_id[:64]!r}: its attempt has ended")
        else:
            kept.append(span)
    if spans and not matched:
        raise ForbiddenError(
            "the bearer token is neither the run's operator key nor the credential of any attempt "
            "these spans name; an agent exports only its own attempt's spans, with the key it was handed"
        )
    if spans and matched and not kept and all(p.endswith("its attempt has ended") for p in problems):
        raise AttemptEndedError("the attempt these spans belong to has ended; it takes no more spans")
    return kept, problems


async def _memo(live: dict[tuple[str, str], bool], attempt: tuple[str, str], store: Store) -> bool:
    if attempt not in live:
        live[attempt] = await _is_live(store, *attempt)
    return live[attempt]


async def _is_live(store: Store, rollout_id: str, attempt_id: str) -> bool:
    """Whether the attempt is live, asked of the store each time: a reward must not slip in after
    the attempt's end."""
    try:
        attempts = await store.list_attempts(rollout_id)
    except NotFoundError:
        return False
    return any(a.attempt_id == attempt_id and a.is_live for a in attempts)


_ROLLOUT_HEADER = api.ROLLOUT_HEADER.lower().encode("latin-1")
_ATTEMPT_HEADER = api.ATTEMPT_HEADER.lower().encode("latin-1")


def _text_header(scope: Scope, name: bytes) -> str | None:
    value = header(scope, name)
    return None if value is None else value.decode("latin-1")


def _export_response(content_type: str, problems: list[str], rejected: int) -> Answer:
    message = "; ".join(problems[:10])
    if content_type == PROTOBUF:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

        response = pb.ExportTraceServiceResponse()
        if problems:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = message
        return Answer(200, response.SerializeToString(), media_type=PROTOBUF.encode())
    partial = (
        {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}} if problems else {}
    )
    return Answer(200, json.dumps(partial).encode())


_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
_OPENAPI: dict[str, Any] = {
    "tags": ["otlp"],
    "summary": "OTLP/HTTP trace export (protobuf or JSON)",
    "operationId": "otlp_traces",
    "requestBody": {
        "required": True,
        "content": {
            PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
            "application/json": {
                "schema": {"$ref": f"#/components/schemas/{OtlpExportTraceServiceRequest.__name__}"}
            },
        },
    },
    "responses": {
        "200": {
            "description": "Stored; rejected spans are counted in partialSuccess",
            "content": {
                PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                "application/json": {
                    "schema": {"$ref": f"#/components/schemas/{OtlpExportTraceServiceResponse.__name__}"}
                },
            },
        },
        "400": {"description": "Body is not OTLP", "content": _ERROR},
        "401": {"description": "Missing bearer token", "content": _ERROR},
        "403": {
            "description": "Wrong bearer token, or an attempt's credential for spans of other attempts",
            "content": _ERROR,
        },
        "408": {"description": "The body stopped coming before it was whole", "content": _ERROR},
        "409": {"description": "The attempt the spans belong to has ended", "content": _ERROR},
        "413": {"description": "Body too large", "content": _ERROR},
        "415": {"description": "Not protobuf or JSON, or an unsupported Content-Encoding", "content": _ERROR},
        "503": {"description": "The store's database is unavailable; retry", "content": _ERROR},
    },
}
