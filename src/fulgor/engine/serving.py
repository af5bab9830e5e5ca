"""fulgor's engine and vLLM as :class:`~fulgor.engine.base.Engine`\\ s a training session drives.

:class:`LocalEngineServer` loads the model (and one engine per LoRA adapter, when each agent has
its own) and serves it over HTTP on a thread of its own; it swaps weights between calls, so a
publish needs no pause. :class:`VLLMEngine` starts and supervises vLLM (or attaches to the one its
``url`` names) through :class:`~fulgor.engine.vllm.VLLMServer` and reloads weights in place or
loads an adapter under a new name; vLLM's answers name no version, so the calls stop while it
reloads. Neither knows the gateway: the session points the gateway at their :attr:`url`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from fulgor.engine.chat_format import ChatFormat, read_chat_template
from fulgor.engine.errors import EngineUnavailableError
from fulgor.engine.vllm import VLLMConfig, VLLMServer
from fulgor.errors import ConfigError

if TYPE_CHECKING:
    from fulgor.engine.local import EngineConfig, LocalEngine
    from fulgor.net.asgi import ServerThread

__all__ = ["LocalEngineServer", "VLLMEngine"]

logger = logging.getLogger(__name__)


class LocalEngineServer:
    """fulgor's own engine, served over HTTP on a thread: the model of ``config``, and beside it one
    engine per entry of ``adapters`` (a name and a model directory: the base, or a LoRA adapter over
    it), served as ``MODEL-NAME``."""

    def __init__(self, config: EngineConfig, adapters: Mapping[str, Path] | None = None) -> None:
        self.config = config
        self._adapter_dirs = dict(adapters or {})
        self._engine: LocalEngine | None = None
        self._adapters: dict[str, LocalEngine] = {}
        self._server: ServerThread | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise EngineUnavailableError("the local engine is not serving yet; start() it first")
        return self._url

    @property
    def api_key(self) -> str | None:
        return None

    @property
    def request_token_ids(self) -> bool:
        return True

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def agent_models(self) -> dict[str, str]:
        return {name: engine.model_name for name, engine in self._adapters.items()}

    @property
    def model_version(self) -> int:
        """The version served (the adapters' when there are any: the base never changes then)."""
        if self._adapters:
            return max(engine.model_version for engine in self._adapters.values())
        return self.config.model_version if self._engine is None else self._engine.model_version

    @property
    def publishes_between_calls(self) -> bool:
        return True

    @property
    def chat_format(self) -> ChatFormat | None:
        return None if self._engine is None else self._engine.chat_format

    @property
    def history_format(self) -> None:
        """None: the engine normalises history itself, before rendering."""
        return None

    async def start(self) -> None:
        """Load the model and the adapters' engines, then serve them on a thread of their own."""
        from fulgor.engine.app import create_app
        from fulgor.engine.local import LocalEngine
        from fulgor.net.asgi import ServerThread

        self._engine = await asyncio.to_thread(LocalEngine.from_config, self.config)
        for name, path in self._adapter_dirs.items():
            config = replace(self.config, model=path, served_model_name=f"{self.model_name}-{name}")
            self._adapters[name] = await asyncio.to_thread(LocalEngine.from_config, config)
        self._server = ServerThread(create_app(self._engine, adapters=list(self._adapters.values())))
        self._url = f"{await asyncio.to_thread(self._server.start)}/v1"

    async def stop(self) -> None:
        """Stop serving; the app's lifespan stops the engines."""
        if self._server is not None:
            await self._server.astop()

    async def publish(self, checkpoint: Path) -> int:
        """Swap ``checkpoint`` in between calls; with adapters, ``checkpoint/NAME`` into each
        adapter's engine. Returns the new version."""
        if self._engine is None:
            raise EngineUnavailableError("the local engine is not serving yet; start() it first")
        if not self._adapters:
            return (await self._engine.swap_weights(checkpoint)).model_version
        swaps = [await engine.swap_weights(checkpoint / name) for name, engine in self._adapters.items()]
        return max(swap.model_version for swap in swaps)


class VLLMEngine:
    """vLLM under fulgor's supervisor (or the running server ``config.url`` names). One LoRA
    adapter per agent is refused here, before anything starts: the Trainer serves those on the
    local engine only."""

    def __init__(self, config: VLLMConfig, adapters: Mapping[str, Path] | None = None) -> None:
        if adapters:
            raise ConfigError(
                "one LoRA adapter per agent is served by the local engine only; train a single "
                "adapter or full weights on vLLM, or use engine=EngineConfig(model=DIR)"
            )
        self.config = config
        self.server = VLLMServer(config)
        self._chat_format: ChatFormat | None = None

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1"

    @property
    def api_key(self) -> str | None:
        return self.config.api_key

    @property
    def request_token_ids(self) -> bool:
        return True

    @property
    def model_name(self) -> str:
        """The name vLLM serves the weights under now: a LoRA adapter's changes with each version."""
        return self.server.model_name

    @property
    def agent_models(self) -> dict[str, str]:
        return dict(self.server.adapter_names)

    @property
    def model_version(self) -> int:
        return self.server.model_version

    @property
    def publishes_between_calls(self) -> bool:
        """False: vLLM names no version in its answers and would serve a call running across a
        reload with both."""
        return False

    @property
    def chat_format(self) -> ChatFormat | None:
        """The template and parsers vLLM was given (:func:`~fulgor.engine.vllm.build_command`),
        probed on the model's tokenizer; None before ``start``, or for a model vLLM serves by a
        name that is no directory here."""
        return self._chat_format

    @property
    def history_format(self) -> ChatFormat | None:
        """The chat format, when its template cannot render tool calls or tool results: vLLM
        renders history as it is sent, so the gateway normalises it first, as fulgor's engine
        does."""
        known = self._chat_format
        return known if known is not None and known.rewrites_history else None

    async def start(self) -> None:
        """Launch vLLM (or attach to it) and wait until it is healthy; then read its chat format."""
        await asyncio.to_thread(self.server.start)
        self._chat_format = await asyncio.to_thread(served_chat_format, self.config)

    async def stop(self) -> None:
        """Stop vLLM and its supervision (a server given by ``url`` is left running)."""
        await asyncio.to_thread(self.server.stop)

    async def publish(self, checkpoint: Path) -> int:
        """Reload: full weights in place, a LoRA adapter under its version's name (see
        :meth:`VLLMServer.reload_weights`). Stop the calls first."""
        return await asyncio.to_thread(self.server.reload_weights, checkpoint)


def served_chat_format(config: VLLMConfig) -> ChatFormat | None:
    """The chat format vLLM serves ``config.model`` with: the template given, else the model's own,
    on the model directory's tokenizer, with the parsers fulgor's engine would choose; None when the
    model is no directory here or its tokenizer cannot be read (logged)."""
    from fulgor.weights.loading import require_transformers

    model = Path(config.model)
    if not model.is_dir():
        return None
    transformers = require_transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as error:
        logger.warning("cannot read the tokenizer of %s (%s): its chat format is unknown", model, error)
        return None
    template = read_chat_template(config.chat_template) if config.chat_template else None
    return ChatFormat.of(tokenizer, template, config.tool_call_parser, config.reasoning_parser)
