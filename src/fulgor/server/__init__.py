"""The server: the one HTTP app ``fulgor serve`` runs, above the store and the gateway.

``create_app(ServerConfig(store=..., gateway=..., token=...))`` serves the store's operations under
``/api/v1`` (the protocol :class:`fulgor.store.StoreClient` speaks), OTLP/HTTP span ingestion at
``/v1/traces``, the gateway's per-rollout URLs when a gateway is given, ``/healthz`` and the spec at
``/openapi.json``, all from one routing table. :class:`BackgroundServer` serves it on a thread.
What it does not know: how a store keeps its data, or how the gateway records a call.
"""

from __future__ import annotations

from fulgor.server.app import App, BackgroundServer, check_bind, create_app
from fulgor.server.config import ServerConfig

__all__ = ["App", "BackgroundServer", "ServerConfig", "check_bind", "create_app"]
