"""One error tree for fulgor.

Every error carries a stable ``code`` (used by servers to build ``{"error": {"code", "message"}}``
bodies; the HTTP mapping lives only in the servers) and a message that says what to do.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "FulgorError",
    "InvalidTransitionError",
    "NotFoundError",
    "PortInUseError",
    "StoreError",
    "StoreUnavailableError",
    "ValidationError",
]


class FulgorError(Exception):
    """Root of every error fulgor raises on purpose."""

    code: str = "fulgor_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(FulgorError):
    """A configuration value is missing or invalid; the message names it and the fix."""

    code = "config_error"


class PortInUseError(ConfigError):
    """A TCP port a server should listen on is taken by another process."""

    code = "port_in_use"

    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            f"port {port} on {host} is already in use: stop the process holding it "
            f"(find it with `lsof -i :{port}` or `ss -ltnp 'sport = :{port}'`), or choose another port "
            "with --port P (--port 0 picks a free one)"
        )
        self.host = host
        self.port = port


class ValidationError(FulgorError):
    """An input payload is invalid; the message names the offending field."""

    code = "validation_error"


class StoreError(FulgorError):
    """Base of the store's errors."""

    code = "store_error"


class StoreUnavailableError(StoreError):
    """The store's database cannot be reached or dropped the connection; retrying may succeed.

    Servers answer it with 503 (never remembered for an ``Idempotency-Key``), which clients retry.
    """

    code = "store_unavailable"


class NotFoundError(StoreError):
    """A rollout, attempt, resources or worker id does not exist."""

    code = "not_found"


class InvalidTransitionError(StoreError):
    """A status change the rollout or attempt state machine does not allow."""

    code = "invalid_transition"

    def __init__(self, kind: str, object_id: str, from_status: str, to_status: str) -> None:
        super().__init__(
            f"{kind} {object_id!r} cannot go from {from_status!r} to {to_status!r}; "
            f"see the {kind} state machine in fulgor.store.base"
        )
        self.kind = kind
        self.object_id = object_id
        self.from_status = from_status
        self.to_status = to_status
