"""The store's HTTP API as data: request bodies, query parameters, paths and response types.

Server and client both build on these definitions, so a route and its client call cannot drift
apart. The module knows pydantic only; it imports no web framework.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from fulgor.limits import quoted
from fulgor.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    JsonDict,
    Resource,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    Worker,
)

PREFIX: Final = "/api/v1"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
MAX_IDEMPOTENCY_KEY_LENGTH: Final = 200
ROLLOUT_HEADER: Final = "X-Fulgor-Rollout-Id"
ATTEMPT_HEADER: Final = "X-Fulgor-Attempt-Id"
# A span query's answer counts here the stored spans it skipped because they no longer read back.
SPANS_UNREADABLE_HEADER: Final = "X-Fulgor-Spans-Unreadable"

WorkerId = Annotated[str, Field(min_length=1, max_length=256)]
# Pages beyond 2**53 cannot exist, and larger numbers overflow database integers.
MAX_PAGE = 2**53


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnqueueBody(_Body):
    requests: list[RolloutRequest]


class StartRolloutBody(_Body):
    request: RolloutRequest
    worker_id: WorkerId


class ClaimBody(_Body):
    worker_id: WorkerId
    limit: int = Field(default=1, ge=1, le=10_000)
    wait_seconds: float = Field(
        default=0,
        ge=0,
        allow_inf_nan=False,
        description="Held server-side up to the server's cap; clients loop for longer.",
    )


class CancelBody(_Body):
    rollout_ids: list[str]


class StartAttemptBody(_Body):
    worker_id: WorkerId


class UpdateAttemptBody(_Body):
    status: AttemptStatus | None = None
    error: str | None = None
    metadata: JsonDict | None = None


class AddSpansBody(_Body):
    spans: list[Span]


class PutResourcesBody(_Body):
    resources: dict[str, Resource]
    resources_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None


class HeartbeatBody(_Body):
    worker_id: WorkerId
    stats: JsonDict | None = None
    attempt_ids: list[str] | None = Field(
        default=None,
        description="Refresh only these live attempts of the worker (those it is running); the "
        "others are left to the unresponsive watchdog. Omit to refresh every live attempt it owns.",
    )


class WaitBody(_Body):
    rollout_ids: list[str]
    timeout_seconds: float = Field(
        ge=0,
        allow_inf_nan=False,
        description="Held server-side up to the server's cap; clients loop for longer.",
    )


class QueryRolloutsParams(_Body):
    status: list[RolloutStatus | Literal[""]] | None = Field(
        default=None, description="Repeat for several statuses; one empty value alone matches nothing."
    )
    group_id: str | None = None
    mode: RolloutMode | None = None
    limit: int | None = Field(default=None, ge=0, le=MAX_PAGE)
    offset: int = Field(default=0, ge=0, le=MAX_PAGE)
    order: Literal["asc", "desc"] = "asc"


class QuerySpansParams(_Body):
    attempt_id: str | None = Field(default=None, description="An attempt id, or 'latest'.")
    name: str | None = None
    limit: int | None = Field(default=None, ge=0, le=MAX_PAGE)
    offset: int = Field(default=0, ge=0, le=MAX_PAGE)


class GetResourcesParams(_Body):
    resources_id: str | None = Field(default=None, description="Omit for the latest version.")


class ErrorDetail(_Body):
    code: str = Field(description="Stable machine-readable code, e.g. not_found, validation_error.")
    message: str = Field(description="What went wrong and what to do about it.")
    details: JsonDict | None = Field(default=None, description="Structured context, when there is any.")


class ErrorBody(_Body):
    """Every 4xx and 5xx response body."""

    error: ErrorDetail


class Health(_Body):
    status: Literal["ok"] = "ok"
    version: str


ROLLOUT: Final = TypeAdapter(Rollout)
ROLLOUTS: Final = TypeAdapter(list[Rollout])
ATTEMPTED: Final = TypeAdapter(AttemptedRollout)
ATTEMPTEDS: Final = TypeAdapter(list[AttemptedRollout])
ATTEMPT: Final = TypeAdapter(Attempt)
ATTEMPTS: Final = TypeAdapter(list[Attempt])
SPANS: Final = TypeAdapter(list[Span])
RESOURCES_VERSION: Final = TypeAdapter(ResourcesVersion)
MAYBE_RESOURCES_VERSION: Final = TypeAdapter(ResourcesVersion | None)
WORKER: Final = TypeAdapter(Worker)
WORKERS: Final = TypeAdapter(list[Worker])
STATS: Final = TypeAdapter(StoreStats)


def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the field path users write: ``spans[1].start_time``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.startswith(("function-", "tagged-union")):
            continue
        else:
            # A dict key is the caller's text: quoted short, as every echoed value is.
            text = quoted(str(part), bare=True)
            path += f".{text}" if path else text
    return path or "body"
