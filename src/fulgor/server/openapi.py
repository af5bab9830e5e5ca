"""The server's OpenAPI spec, served at ``/openapi.json``: every route that documents itself.

Routes carry their own operation objects (health, OTLP); the store's operations are described from
their table in :mod:`fulgor.server.store_api`, with their bodies and answers as component schemas
generated together, so every ``$ref`` resolves. Built on the first request, then kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter

from fulgor.server.otlp_json import OtlpExportTraceServiceRequest, OtlpExportTraceServiceResponse
from fulgor.server.routing import Route
from fulgor.server.store_api import OPERATIONS, Operation
from fulgor.store import http_api as api

__all__ = ["SCHEMA_REF", "build_spec", "json_content", "ref"]

SCHEMA_REF = "#/components/schemas/{model}"

ERROR_STATUSES = {
    "400": "Invalid input: the body, a query parameter or a value breaks a rule or a limit (code "
    "validation_error); the message names the field",
    "408": "The request body stopped coming before it was whole; the connection is closed",
    "401": "Missing bearer token",
    "403": "Wrong bearer token",
    "404": "Unknown rollout, attempt or resources id (code not_found)",
    "405": "Method not allowed on this path",
    "409": "Impossible status change (code invalid_transition)",
    "413": "Request body too large",
    "503": "The store's database is unavailable (code store_unavailable); retry later",
}


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": SCHEMA_REF.format(model=model.__name__)}


def json_content(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def build_spec(routes: Sequence[Route], *, title: str, version: str, secured: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``; with ``secured``, every route but the open ones
    names the bearer scheme."""
    components, responses = _component_schemas()
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if route.operation is not None:
            paths.setdefault(route.path, {})[route.method.lower()] = dict(route.operation)
    for operation in OPERATIONS:
        paths.setdefault(api.PREFIX + operation.path, {})[operation.method.lower()] = _store_operation(
            operation, responses[operation.name]
        )
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": components},
    }
    if secured:
        open_paths = {route.path for route in routes if route.open}
        for path, path_item in paths.items():
            if path not in open_paths:
                for item in path_item.values():
                    item["security"] = [{"bearer": []}]
        spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return spec


def _component_schemas() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """All component schemas, and each store operation's 200 schema, from one consistent generation."""
    inputs: list[tuple[Any, Any, TypeAdapter[Any]]] = [
        (operation.name, "serialization", operation.response) for operation in OPERATIONS
    ]
    models: list[type[BaseModel]] = [o.body for o in OPERATIONS if o.body is not None]
    models += [api.ErrorBody, api.Health, OtlpExportTraceServiceRequest, OtlpExportTraceServiceResponse]
    for model in models:
        inputs.append((model.__name__, "validation", TypeAdapter(model)))
    keyed, top = TypeAdapter.json_schemas(inputs, ref_template=SCHEMA_REF)
    responses = {key: schema for (key, mode), schema in keyed.items() if mode == "serialization"}
    return dict(top.get("$defs", {})), responses


def _store_operation(operation: Operation, answer: dict[str, Any]) -> dict[str, Any]:
    """A store operation's request body, parameters and responses, pointing at component schemas."""
    responses = {"200": json_content("OK", answer)}
    if operation.name == "query_spans":
        responses["200"]["headers"] = {
            api.SPANS_UNREADABLE_HEADER: {
                "description": "Stored spans skipped because they no longer read back (stored past "
                "fulgor.limits by an older version); the rollout's trace is incomplete when not 0",
                "required": True,
                "schema": {"type": "integer", "minimum": 0},
            }
        }
    for status, description in ERROR_STATUSES.items():
        responses[status] = json_content(description, ref(api.ErrorBody))
    described: dict[str, Any] = {
        "tags": ["store"],
        "summary": operation.summary,
        "operationId": operation.name,
        "responses": responses,
    }
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in ("rollout_id", "attempt_id")
        if "{" + name + "}" in operation.path
    ]
    if operation.query is not None:
        parameters += _query_parameters(operation.query, operation.list_fields)
    if operation.body is not None:
        described["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref(operation.body)}},
        }
    if operation.idempotent:
        parameters.append(
            {
                "name": api.IDEMPOTENCY_HEADER,
                "in": "header",
                "required": False,
                "description": "A retried request with the same key gets the first answer.",
                "schema": {"type": "string", "maxLength": api.MAX_IDEMPOTENCY_KEY_LENGTH},
            }
        )
    if parameters:
        described["parameters"] = parameters
    return described


def _query_parameters(model: type[BaseModel], list_fields: frozenset[str]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=SCHEMA_REF)
    parameters = []
    for name, prop in schema["properties"].items():
        options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
        value = {k: v for k, v in options[0].items() if k != "title"}
        parameter: dict[str, Any] = {"name": name, "in": "query", "required": False, "schema": value}
        if "description" in prop:
            parameter["description"] = prop["description"]
        if name in list_fields:
            parameter.update(style="form", explode=True)
        parameters.append(parameter)
    return parameters
