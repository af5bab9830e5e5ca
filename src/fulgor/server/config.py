"""ServerConfig: what the server serves and how, as plain typed values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from fulgor import limits
from fulgor.store.base import Store

if TYPE_CHECKING:
    from fulgor.gateway import Gateway
    from fulgor.server.routing import Route

__all__ = ["Pages", "ServerConfig"]


class Pages(Protocol):
    """Routes served beside the store's (each checks its own sign-in), and what to close after."""

    def routes(self) -> list[Route]: ...

    async def close(self) -> None: ...


@dataclass
class ServerConfig:
    """What the server serves (a store and, optionally, the gateway) and its limits.

    The app starts and closes the ``gateway`` with itself, and closes ``store`` on shutdown unless
    ``close_store`` is off (a store its caller goes on using). ``token``: when set, every route but
    ``/healthz`` and ``/openapi.json`` needs ``Authorization: Bearer TOKEN`` (the gateway checks the
    run's key itself). Request bodies over ``max_body_bytes`` get 413, and a body whose next part
    takes longer than ``body_timeout_seconds`` gets 408 and a closed connection (the mounted gateway
    answers in its own callers' shape, with its own limits); long-polls are held at most
    ``max_wait_seconds`` (clients ask again); the ``idempotency_entries`` most recent
    ``Idempotency-Key`` answers are remembered. ``pages``: more routes served beside the
    store's, closed with the app (the dashboard, :mod:`fulgor.dashboard`).
    """

    store: Store
    gateway: Gateway | None = None
    pages: Pages | None = None
    token: str | None = field(default=None, repr=False)
    close_store: bool = True
    max_body_bytes: int = limits.MAX_BODY_BYTES
    body_timeout_seconds: float = limits.BODY_TIMEOUT_SECONDS
    max_wait_seconds: float = 30.0
    idempotency_entries: int = 10_000
