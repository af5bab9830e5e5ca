"""ExternalEngine: an OpenAI-compatible server fulgor only calls (a vLLM it did not start, a hosted
API), as an :class:`~fulgor.engine.base.Engine`.

It starts and stops nothing, and its weights are its own: ``publish`` is refused, and it has no
model version. The model its calls are served with is the one named, else the one model its
``/models`` lists (asked at ``start``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fulgor.errors import ConfigError
from fulgor.gateway.config import Upstream
from fulgor.gateway.upstreams import served_model

if TYPE_CHECKING:
    from fulgor.engine.chat_format import ChatFormat

__all__ = ["ExternalEngine"]


class ExternalEngine:
    """The server at ``upstream``, serving calls with ``model_name`` (None: the one it lists)."""

    def __init__(self, upstream: Upstream, model_name: str | None = None) -> None:
        self.upstream = upstream
        self._model_name = model_name

    @property
    def url(self) -> str:
        return self.upstream.url

    @property
    def api_key(self) -> str | None:
        return self.upstream.api_key

    @property
    def request_token_ids(self) -> bool:
        return self.upstream.request_token_ids

    @property
    def model_name(self) -> str:
        if self._model_name is None:
            raise ConfigError("an upstream needs the model_name to serve its calls with")
        return self._model_name

    @property
    def agent_models(self) -> dict[str, str]:
        return {}

    @property
    def model_version(self) -> None:
        return None

    @property
    def publishes_between_calls(self) -> bool:
        """True: publishing changes nothing there, so no call need wait for it (it is refused)."""
        return True

    @property
    def chat_format(self) -> ChatFormat | None:
        """None: the server's template and parsers are its own, unknown to fulgor."""
        return None

    @property
    def history_format(self) -> ChatFormat | None:
        """None: with its template unknown, the agent's history goes as sent."""
        return None

    async def start(self) -> None:
        """Ask the server which model it serves, unless one was named; a ConfigError when it
        cannot say (:func:`~fulgor.gateway.upstreams.served_model`)."""
        if self._model_name is None:
            self._model_name = await served_model(self.upstream)

    async def stop(self) -> None:
        """Nothing to stop: the server is not fulgor's."""

    async def publish(self, checkpoint: Path) -> int:
        raise ConfigError("the session's model is an upstream server: there are no weights to swap")
