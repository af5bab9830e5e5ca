"""OTLP/JSON's ``ExportTraceServiceRequest`` as pydantic models: what ``POST /v1/traces`` checks a
JSON body against, and what its OpenAPI entry shows.

The shape is protobuf's JSON mapping with OTLP's deviations: lowerCamelCase keys (snake_case read
too), hex trace and span ids, 64-bit integers as decimal strings or numbers, doubles as numbers or
``"NaN"``/``"Infinity"``/``"-Infinity"``. A body of another shape (a span that is a number, a name
that is not a string, JSON nested past the parser's limit) cannot be decoded, and OTLP answers such
a request with 400 as a whole. Fields OTLP defines that fulgor does not read (links, flags, scope)
are accepted with any value, and unknown fields are ignored, as OTLP receivers must.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["OtlpExportTraceServiceRequest", "OtlpExportTraceServiceResponse"]

# fixed64 and int64 fields: decimal strings (what exporters write) or JSON numbers.
Unsigned = Annotated[str, Field(pattern=r"^[0-9]+$")] | Annotated[int, Field(ge=0)]
Signed = Annotated[str, Field(pattern=r"^-?[0-9]+$")] | int
Double = float | Literal["NaN", "Infinity", "-Infinity"] | Annotated[str, Field(pattern=r"^-?[0-9.eE+-]+$")]


class _Otlp(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class OtlpAnyValue(_Otlp):
    """One value; the first kind set is the value (none set: no value)."""

    string_value: str | None = None
    bool_value: bool | None = None
    int_value: Signed | None = None
    double_value: Double | None = None
    array_value: OtlpArrayValue | None = None
    kvlist_value: OtlpKeyValueList | None = None
    bytes_value: str | None = Field(default=None, description="base64")


class OtlpArrayValue(_Otlp):
    values: list[OtlpAnyValue] = Field(default_factory=list)


class OtlpKeyValue(_Otlp):
    key: str
    value: OtlpAnyValue | None = None


class OtlpKeyValueList(_Otlp):
    values: list[OtlpKeyValue] = Field(default_factory=list)


class OtlpStatus(_Otlp):
    code: int | str | None = Field(default=None, description="0 unset, 1 ok, 2 error (or STATUS_CODE_*)")
    message: str | None = None


class OtlpEvent(_Otlp):
    time_unix_nano: Unsigned | None = None
    name: str | None = None
    attributes: list[OtlpKeyValue] | None = None


class OtlpSpan(_Otlp):
    trace_id: str | None = Field(default=None, description="hex")
    span_id: str | None = Field(default=None, description="hex")
    parent_span_id: str | None = Field(default=None, description="hex")
    name: str | None = None
    kind: int | str | None = None
    start_time_unix_nano: Unsigned | None = None
    end_time_unix_nano: Unsigned | None = None
    attributes: list[OtlpKeyValue] | None = None
    events: list[OtlpEvent] | None = None
    status: OtlpStatus | None = None
    links: list[Any] | None = None


class OtlpScopeSpans(_Otlp):
    scope: dict[str, Any] | None = None
    spans: list[OtlpSpan] | None = None


class OtlpResource(_Otlp):
    attributes: list[OtlpKeyValue] | None = None


class OtlpResourceSpans(_Otlp):
    resource: OtlpResource | None = None
    scope_spans: list[OtlpScopeSpans] | None = None


class OtlpExportTraceServiceRequest(_Otlp):
    """An OTLP/JSON ``ExportTraceServiceRequest``."""

    resource_spans: list[OtlpResourceSpans] | None = None


class OtlpPartialSuccess(_Otlp):
    rejected_spans: str = Field(description="How many spans were not stored, as a decimal string")
    error_message: str = Field(description="Why, for the first few")


class OtlpExportTraceServiceResponse(_Otlp):
    """The answer: empty when every span was stored."""

    partial_success: OtlpPartialSuccess | None = None
