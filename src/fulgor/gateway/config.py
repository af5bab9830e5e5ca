"""GatewayConfig and Upstream: what the gateway needs to know, as plain typed values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from fulgor import limits
from fulgor.errors import ConfigError

if TYPE_CHECKING:
    from fulgor.engine.chat_format import ChatFormat

__all__ = ["GatewayConfig", "Upstream"]


@dataclass(frozen=True)
class Upstream:
    """One OpenAI-compatible replica: the local engine, a vLLM server or any OpenAI-compatible URL.

    ``url`` is its base URL, ending in ``/v1``. ``request_token_ids`` asks it for vLLM's token id
    fields (``return_token_ids``); turn it off for APIs that reject unknown fields; their calls are
    then recorded with ``token_ids_missing``. ``api_key`` is sent upstream instead of the agent's key.
    With ``history_format`` (a vLLM engine's chat format, whose template cannot render tool calls
    or tool results), the messages of each chat call go upstream normalised to what the template
    renders, as fulgor's engine normalises them itself (:meth:`ChatFormat.normalise
    <fulgor.engine.chat_format.ChatFormat.normalise>`); the call is recorded as the agent sent it.
    """

    url: str
    api_key: str | None = None
    request_token_ids: bool = True
    history_format: ChatFormat | None = None
    scheme: str = field(init=False)
    host: str = field(init=False)
    port: int = field(init=False)
    base_path: str = field(init=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        bad = f"upstream URL {self.url!r} is not http(s)://HOST[:PORT]/v1"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{bad}; pass the base URL")
        try:
            port = parts.port
        except ValueError:  # not a number, or over 65535
            port = 0
        if port == 0:
            raise ConfigError(f"{bad}: its port is not a number from 1 to 65535; fix the port")
        object.__setattr__(self, "scheme", parts.scheme)
        object.__setattr__(self, "host", parts.hostname)
        object.__setattr__(self, "port", port or (443 if parts.scheme == "https" else 80))
        object.__setattr__(self, "base_path", parts.path.rstrip("/"))


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway behaves; every field has a default that suits one machine.

    ``api_key``: the run's operator key; when set, the admin routes need it, and every call needs it
    or the credential of the attempt whose URL it calls (:mod:`fulgor.credentials`), as
    ``Authorization: Bearer`` or ``x-api-key``. ``check_rollouts``: refuse URLs of unknown (404)
    or ended (409) attempts; a positive check is cached for ``rollout_cache_seconds``. Upstream
    calls are retried ``max_retries`` times on connection errors and 429/502/503/504, waiting
    ``retry_backoff_seconds`` doubled each time. At most ``record_queue_size`` calls wait to be
    written; beyond that new calls wait (backpressure). Spans are written ``record_batch_size`` at
    a time, after waiting up to ``record_linger_seconds`` for a batch to fill; a store that is away
    is retried for ``record_retry_seconds`` before spans are counted as lost.

    A call's body may be at most ``max_body_bytes`` (413 past it) and must arrive without a pause
    longer than ``body_timeout_seconds`` (408, and the connection is closed); its JSON may nest at
    most ``fulgor.limits.MAX_JSON_DEPTH`` levels less the two its record adds (400), so every call
    the gateway forwards can be recorded and read back.

    Every call is served with the model its rollout's resources name, whatever model the agent's
    code sends (:mod:`fulgor.gateway.model_names`), unless ``model_map`` names the model for the
    name sent; ``default_model`` serves rollouts whose resources name no LLM.
    """

    api_key: str | None = None
    check_rollouts: bool = True
    rollout_cache_seconds: float = 2.0
    max_retries: int = 3
    retry_backoff_seconds: float = 0.2
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 600.0
    record_queue_size: int = 4096
    record_batch_size: int = 256
    record_linger_seconds: float = 0.01
    record_retry_seconds: float = 30.0
    retry_after_seconds: float = 2.0
    model_version: int | None = None
    model_map: Mapping[str, str] = field(default_factory=dict)
    default_model: str | None = None
    max_body_bytes: int = limits.MAX_MODEL_CALL_BODY_BYTES
    body_timeout_seconds: float = limits.BODY_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.record_queue_size < 1 or self.record_batch_size < 1:
            raise ConfigError("max_retries must be >= 0 and record_queue_size, record_batch_size >= 1")
        if self.max_body_bytes < 1 or not self.body_timeout_seconds > 0:
            raise ConfigError("max_body_bytes must be >= 1 and body_timeout_seconds > 0")
