"""The gateway's errors: each has a stable code and the HTTP status the gateway answers with."""

from __future__ import annotations

from fulgor.errors import FulgorError

__all__ = [
    "BadRequestError",
    "ForbiddenError",
    "GatewayError",
    "GatewayPausedError",
    "PayloadTooLargeError",
    "RequestTimeoutError",
    "RolloutFinishedError",
    "RolloutNotFoundError",
    "UnauthorizedError",
    "UpstreamError",
    "UpstreamTimeoutError",
]


class GatewayError(FulgorError):
    """Base of the gateway's errors; ``status`` is the HTTP status it is answered with."""

    code = "gateway_error"
    status = 500


class BadRequestError(GatewayError):
    """The request body is not what the API expects."""

    code = "invalid_request"
    status = 400


class RequestTimeoutError(GatewayError):
    """The request body stopped coming (``GatewayConfig.body_timeout_seconds``); the connection is
    closed after the answer."""

    code = "request_timeout"
    status = 408


class PayloadTooLargeError(GatewayError):
    """The request body is larger than ``GatewayConfig.max_body_bytes``."""

    code = "payload_too_large"
    status = 413


class UnauthorizedError(GatewayError):
    """The run's key is missing."""

    code = "unauthorized"
    status = 401


class ForbiddenError(GatewayError):
    """A key was sent, but not the run's."""

    code = "forbidden"
    status = 403


class RolloutNotFoundError(GatewayError):
    """The URL names a rollout or attempt the store does not know."""

    code = "rollout_not_found"
    status = 404


class RolloutFinishedError(GatewayError):
    """The URL names an attempt that has ended; its rollout takes no more model calls."""

    code = "rollout_finished"
    status = 409


class GatewayPausedError(GatewayError):
    """The gateway is paused (weights are being updated); retry after ``retry_after_seconds``."""

    code = "gateway_paused"
    status = 429

    def __init__(self, message: str, retry_after_seconds: float) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class UpstreamError(GatewayError):
    """No upstream replica answered, after the configured retries."""

    code = "upstream_unavailable"
    status = 502


class UpstreamTimeoutError(UpstreamError):
    """The upstream took the call but did not answer within ``read_timeout_seconds``.

    It is not retried: the engine may still be generating, and a retry elsewhere would run the
    call twice and make the agent wait several timeouts.
    """

    code = "upstream_timeout"
    status = 504
