"""fulgor's own inference engine: transformers + torch on CPU, or CUDA when present.

``LocalEngine`` turns token ids into sampled token ids with logprobs, batching concurrent requests
on one generation thread (:mod:`fulgor.engine.scheduler`), and swaps in new weights between batches
without a restart. The OpenAI-compatible HTTP API over it lives in :mod:`fulgor.engine.app`;
start both with ``fulgor engine --model DIR``.

This module does not know HTTP or the OpenAI formats.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fulgor.engine.chat_format import ChatFormat, check_chat_options, read_chat_template
from fulgor.engine.errors import ContextLengthError, EngineUnavailableError
from fulgor.engine.sampling import SamplingParams
from fulgor.engine.scheduler import ErrorEvent, Event, FinishEvent, Scheduler, Sequence
from fulgor.weights.errors import ModelLoadError
from fulgor.weights.loading import LoadedModel, load_model

__all__ = ["EngineConfig", "LocalEngine", "WeightSwap"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """How the local engine loads and serves a model."""

    model: Path
    served_model_name: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_batch_size: int = 64
    max_prefill_tokens: int = 8192
    seed: int | None = None
    model_version: int = 0
    admin_token: str | None = field(default=None, repr=False)
    chat_template: str | None = None
    """A Jinja file, or the name of a template fulgor ships, in place of the model's own template."""
    tool_call_parser: str | None = None
    """The tool-call parser's name (default: detected from the template, else ``hermes``)."""
    reasoning_parser: str | None = None
    """The reasoning parser's name (default: detected from the template, else none)."""

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.resolve().name


@dataclass(frozen=True)
class WeightSwap:
    """The outcome of a hot weight swap."""

    model_version: int
    path: Path
    kind: str


class LocalEngine:
    """Serves one model; concurrent ``generate`` calls are batched; ``swap_weights`` loads version N+1."""

    def __init__(self, model: LoadedModel, config: EngineConfig) -> None:
        self.config = config
        self._base_path = model.base_path or model.path
        self._scheduler = Scheduler(
            model,
            model_version=config.model_version,
            max_batch_size=config.max_batch_size,
            max_prefill_tokens=config.max_prefill_tokens,
            seed=config.seed,
        )
        self._swap_lock = asyncio.Lock()
        template = read_chat_template(config.chat_template) if config.chat_template else None
        self.chat_format = ChatFormat.of(
            model.tokenizer, template, config.tool_call_parser, config.reasoning_parser
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> LocalEngine:
        """Load ``config.model`` (full weights or a LoRA adapter over its base) and build the engine.

        A chat template or parser name that is wrong fails before the weights load."""
        check_chat_options(config.chat_template, config.tool_call_parser, config.reasoning_parser)
        model = load_model(
            config.model, device=config.device, dtype=config.dtype, max_model_len=config.max_model_len
        )
        return cls(model, config)

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def model_version(self) -> int:
        return self._scheduler.model_version

    @property
    def model(self) -> LoadedModel:
        return self._scheduler.model

    @property
    def tokenizer(self) -> Any:
        return self._scheduler.model.tokenizer

    @property
    def max_model_len(self) -> int:
        return self._scheduler.model.max_model_len

    def stats(self) -> dict[str, int]:
        return self._scheduler.stats()

    def start(self) -> None:
        """Start the generation thread (the HTTP app's lifespan does this; ``generate`` too)."""
        self._scheduler.start()

    def close(self) -> None:
        self._scheduler.stop()

    def check_context(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The number of tokens a request may generate; raises ContextLengthError when it cannot fit."""
        limit = self.max_model_len
        if max_tokens is None:
            if prompt_tokens >= limit:
                raise ContextLengthError(limit, prompt_tokens, None)
            return limit - prompt_tokens
        if prompt_tokens + max_tokens > limit:
            raise ContextLengthError(limit, prompt_tokens, max_tokens)
        return max_tokens

    async def generate(
        self, prompt_ids: list[int], params: list[SamplingParams], *, stream: bool = False
    ) -> AsyncIterator[tuple[int, Event]]:
        """Generate one sequence per entry of ``params`` from the same prompt.

        Yields ``(index, event)``: TokenEvents when ``stream`` is set, then one FinishEvent per index.
        Leaving the iterator early cancels the sequences still running.
        """
        self.start()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        sequences = [
            Sequence(list(prompt_ids), p, _sink(loop, queue, index), stream=stream)
            for index, p in enumerate(params)
        ]
        for sequence in sequences:
            self._scheduler.submit(sequence)
        remaining = len(sequences)
        try:
            while remaining:
                index, event = await queue.get()
                if isinstance(event, ErrorEvent):
                    raise EngineUnavailableError(event.message)
                if isinstance(event, FinishEvent):
                    remaining -= 1
                yield index, event
        finally:
            for sequence in sequences:
                sequence.cancel()

    async def swap_weights(self, path: str | Path) -> WeightSwap:
        """Load ``path`` (full weights, or a LoRA adapter over the last full weights) as version N+1.

        Requests already running finish on version N; requests that arrive meanwhile wait and then
        run on version N+1. Returns once the new version serves.
        """
        source = Path(path)
        async with self._swap_lock:
            loaded = await asyncio.to_thread(self._load_for_swap, source)
            loop = asyncio.get_running_loop()
            done: asyncio.Future[int] = loop.create_future()
            self._scheduler.request_swap(loaded, lambda version: _resolve(loop, done, version))
            version = await done
            if loaded.kind == "full":
                self._base_path = loaded.path
        return WeightSwap(model_version=version, path=source, kind=loaded.kind)

    def _load_for_swap(self, source: Path) -> LoadedModel:
        current = self.model
        loaded = load_model(
            source,
            device=current.device,
            dtype=_dtype_name(current.model.dtype),
            base_path=self._base_path,
            max_model_len=self.config.max_model_len,
        )
        if len(loaded.tokenizer) != len(current.tokenizer):
            raise ModelLoadError(
                f"the checkpoint at {source} has a tokenizer of {len(loaded.tokenizer)} tokens but the "
                f"served model has {len(current.tokenizer)}; a weight swap must keep the tokenizer"
            )
        return loaded


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _sink(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[int, Event]], index: int) -> Any:
    def deliver(event: Event) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (index, event))
        except RuntimeError:
            # The event loop closed (server shutdown); nobody is left to read the event.
            logger.debug("dropped an event for a closed event loop")

    return deliver


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future[int], version: int) -> None:
    def set_result() -> None:
        if not future.done():
            future.set_result(version)

    try:
        loop.call_soon_threadsafe(set_result)
    except RuntimeError:
        logger.debug("weight swap finished after its event loop closed")
