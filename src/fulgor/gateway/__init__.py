"""fulgor's gateway: per-rollout OpenAI- and Anthropic-compatible URLs that record every model call.

An agent only swaps its base URL for ``http://HOST:PORT/r/{rollout_id}/{attempt_id}/v1``; each
call is forwarded to an engine replica and recorded as a ``fulgor.model_call`` span with the
engine's own token ids and logprobs. Chat and text completions pass through; the OpenAI Responses
API (``/v1/responses``, what the OpenAI Agents SDK uses by default) and the Anthropic Messages API
(``/v1/messages``) are translated to chat completions and back. Needs the ``server`` extra.
"""

from __future__ import annotations

from fulgor.gateway import _requirements  # noqa: F401  (names the extra when a dependency is missing)
from fulgor.gateway.app import Gateway, create_gateway_app
from fulgor.gateway.config import GatewayConfig, Upstream
from fulgor.gateway.errors import (
    BadRequestError,
    ForbiddenError,
    GatewayError,
    GatewayPausedError,
    RolloutFinishedError,
    RolloutNotFoundError,
    UnauthorizedError,
    UpstreamError,
    UpstreamTimeoutError,
)

__all__ = [
    "BadRequestError",
    "ForbiddenError",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "GatewayPausedError",
    "RolloutFinishedError",
    "RolloutNotFoundError",
    "UnauthorizedError",
    "Upstream",
    "UpstreamError",
    "UpstreamTimeoutError",
    "create_gateway_app",
]
