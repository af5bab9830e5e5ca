"""Fails early, naming the extra, when the gateway's dependencies are not installed."""

from __future__ import annotations

try:
    import orjson  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("fulgor.gateway needs the server extra: pip install 'fulgor[server]'") from error
