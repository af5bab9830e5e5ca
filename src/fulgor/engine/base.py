"""The ``Engine`` protocol: the model server behind the gateway, whatever kind it is.

A training session serves its model with one of three kinds: fulgor's own engine on a thread
(:class:`~fulgor.engine.serving.LocalEngineServer`), vLLM under fulgor's supervisor
(:class:`~fulgor.engine.serving.VLLMEngine`), or an OpenAI-compatible server fulgor only calls
(:class:`~fulgor.gateway.external.ExternalEngine`). The session starts it, points the gateway at its
URL, publishes each update's weights to it and stops it, through this protocol alone; what each
kind can and cannot do is said by its own members (an external server publishes nothing, vLLM needs
the calls stopped while it reloads). Structural: an engine implements it without subclassing.

What it does not know: the gateway, the store, or what a training step is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fulgor.engine.chat_format import ChatFormat

__all__ = ["Engine"]


class Engine(Protocol):
    """A model server a training session starts, calls through the gateway, publishes to and stops.

    The contract:

    - ``start`` returns once the server answers at :attr:`url`; ``stop`` releases whatever ``start``
      took (threads, processes, ports) and may be called after a ``start`` that failed.
    - :attr:`model_name` is the name calls are served with now: it may change with a publish (vLLM
      serves each LoRA adapter under a name of its own). :attr:`agent_models` names the model each
      agent's adapter is served under (one LoRA adapter per agent), by adapter name.
    - ``publish`` serves a checkpoint directory (full weights, a LoRA adapter, or one adapter per
      agent where the engine serves them) as the next :attr:`model_version` and returns that
      version; an engine that cannot serve it raises the error that says so, a
      :class:`~fulgor.errors.ConfigError` or an engine error. :attr:`model_version` is None on a
      server whose weights fulgor does not own.
    - With :attr:`publishes_between_calls` the engine lets calls running when ``publish`` starts
      finish on the old weights and holds new ones until the new weights serve, each answer
      naming its version; without it, the caller stops the calls first.
    - :attr:`chat_format` is the chat template the engine renders with and its tool-call and
      reasoning parser names (:mod:`fulgor.engine.chat_format`); None when fulgor does not know
      them. :attr:`history_format` is the format the gateway normalises agent history to before
      it forwards a chat call: set for an engine that renders history as it comes (vLLM) with a
      template that cannot render tool calls or tool results; None when nothing needs doing.
    """

    @property
    def url(self) -> str:
        """The base URL of the server's OpenAI API, ending in ``/v1``; known once started."""
        ...

    @property
    def api_key(self) -> str | None:
        """The key calls to the server carry, or None when it takes any."""
        ...

    @property
    def request_token_ids(self) -> bool:
        """Whether calls ask the server for vLLM's token id fields (it rejects no unknown field)."""
        ...

    @property
    def model_name(self) -> str:
        """The model name calls are served with now."""
        ...

    @property
    def agent_models(self) -> dict[str, str]:
        """With one LoRA adapter per agent: the model name each adapter is served under, by name."""
        ...

    @property
    def model_version(self) -> int | None:
        """The version of the weights served now; None when fulgor does not own them."""
        ...

    @property
    def publishes_between_calls(self) -> bool:
        """Whether ``publish`` may run while calls keep arriving (see the class docstring)."""
        ...

    @property
    def chat_format(self) -> ChatFormat | None:
        """The chat template and the tool-call and reasoning parsers served; None when unknown."""
        ...

    @property
    def history_format(self) -> ChatFormat | None:
        """The chat format the gateway normalises chat history to first; None: sent as it is."""
        ...

    async def start(self) -> None:
        """Start serving (or attach to the server that serves); returns once it answers."""
        ...

    async def stop(self) -> None:
        """Stop what ``start`` started; a server fulgor does not own is left running."""
        ...

    async def publish(self, checkpoint: Path) -> int:
        """Serve the weights at ``checkpoint`` as the next version; returns that version."""
        ...
