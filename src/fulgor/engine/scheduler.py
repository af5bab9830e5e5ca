"""Continuous batching over a transformers model with a KV cache, on one generation thread.

Every step the scheduler admits waiting sequences (prefilled together, left-padded, then merged into
the running batch's KV cache), runs one decode step for the whole batch, and retires the sequences
that finished. A sequence that arrives while a batch runs therefore joins at the next step.

Position ids are explicit per row and attention masks are built from lengths, never from token
values: a model may well sample the pad token, and masking by value would then hide real tokens and
corrupt every later logprob. Keys are cached after rotary embedding, so left-padding a cache to merge
it with another changes no row's positions and the merged batch computes the same logprobs.

Weight swaps wait for the running batch to drain: waiting sequences are held back meanwhile, so every
sequence is produced by exactly one model version.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fulgor.engine.detokenize import TextTracker
from fulgor.engine.kv_cache import BatchState, merge, new_cache, select
from fulgor.engine.sampling import SamplingParams, StepSample, sample_step
from fulgor.weights.loading import LoadedModel

__all__ = ["ErrorEvent", "Event", "FinishEvent", "Scheduler", "Sequence", "TokenEvent"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of a streaming sequence; ``text`` is the text it made printable."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    text: str
    model_version: int


@dataclass(frozen=True)
class FinishEvent:
    """A sequence ended; carries its whole output.

    ``stop_reason`` is vLLM's: the stop string or stop token id that ended the sequence, None when
    it ended on an end-of-sequence token or at its length limit.
    """

    finish_reason: str
    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    model_version: int
    stop_reason: str | int | None = None


@dataclass(frozen=True)
class ErrorEvent:
    """A sequence failed inside the engine; the message says why."""

    message: str


Event = TokenEvent | FinishEvent | ErrorEvent
Sink = Callable[[Event], None]


@dataclass(eq=False)
class Sequence:
    """One sequence to generate. ``sink`` receives its events on the generation thread."""

    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink
    stream: bool = False
    cancelled: bool = False
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    tracker: TextTracker | None = None
    generator: Any = None

    def cancel(self) -> None:
        """Stop generating for this sequence at the next step (its consumer went away)."""
        self.cancelled = True


@dataclass
class _Swap:
    model: LoadedModel
    on_done: Callable[[int], None]


class Scheduler:
    """Owns the model and the generation thread; thread-safe ``submit``, ``request_swap`` and ``stop``."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        model_version: int = 0,
        max_batch_size: int = 64,
        max_prefill_tokens: int = 8192,
        seed: int | None = None,
    ) -> None:
        import torch

        self._torch = torch
        self._model = model
        self._version = model_version
        self._max_batch_size = max_batch_size
        self._max_prefill_tokens = max_prefill_tokens
        self._shared_generator = torch.Generator(device=model.device)
        if seed is None:
            self._shared_generator.seed()
        else:
            self._shared_generator.manual_seed(seed)
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._batch: BatchState | None = None
        self._swap: _Swap | None = None
        self._stopping = False
        self._forward_passes = 0  # prefills and decode steps, each one forward pass over its batch
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def model(self) -> LoadedModel:
        return self._model

    @property
    def model_version(self) -> int:
        return self._version

    def stats(self) -> dict[str, int]:
        with self._cond:
            running = len(self._batch.rows) if self._batch else 0
            return {
                "running": running,
                "waiting": len(self._waiting),
                "swap_pending": int(self._swap is not None),
                "model_version": self._version,
                "forward_passes": self._forward_passes,
            }

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="fulgor-engine-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the generation thread; sequences still queued or running get an ErrorEvent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def submit(self, sequence: Sequence) -> None:
        if sequence.params.stop or sequence.stream:
            sequence.tracker = TextTracker(self._model.tokenizer, sequence.params.stop)
        if sequence.params.seed is not None:
            generator = self._torch.Generator(device=self._model.device)
            sequence.generator = generator.manual_seed(sequence.params.seed)
        with self._cond:
            if self._stopping:
                sequence.sink(ErrorEvent("the engine is shutting down; retry against a running engine"))
                return
            self._waiting.append(sequence)
            self._cond.notify_all()

    def request_swap(self, model: LoadedModel, on_done: Callable[[int], None]) -> None:
        """Serve ``model`` as the next version once the running batch drains; ``on_done(version)``."""
        with self._cond:
            if self._swap is not None:
                raise RuntimeError("a weight swap is already pending")
            self._swap = _Swap(model, on_done)
            self._cond.notify_all()

    # -- generation thread -------------------------------------------------------------------

    def _has_work(self) -> bool:
        if self._batch is not None:
            return True
        return self._swap is not None or bool(self._waiting)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._has_work():
                    self._cond.wait()
                if self._stopping:
                    break
                swap = self._swap if self._batch is None else None
                admitted = [] if self._swap is not None else self._admit_locked()
            if swap is not None:
                self._apply_swap(swap)
                continue
            self._step(admitted)
        self._fail_all("the engine stopped before this request finished; retry against a running engine")

    def _admit_locked(self) -> list[Sequence]:
        running = len(self._batch.rows) if self._batch else 0
        admitted: list[Sequence] = []
        longest = 0
        while self._waiting and running + len(admitted) < self._max_batch_size:
            candidate = self._waiting[0]
            if candidate.cancelled:
                self._waiting.popleft()
                continue
            longest_after = max(longest, len(candidate.prompt_ids))
            if admitted and longest_after * (len(admitted) + 1) > self._max_prefill_tokens:
                break
            admitted.append(self._waiting.popleft())
            longest = longest_after
        return admitted

    def _apply_swap(self, swap: _Swap) -> None:
        with self._cond:
            self._model = swap.model
            self._version += 1
            self._swap = None
            version = self._version
            self._cond.notify_all()
        logger.info("now serving model version %d from %s", version, swap.model.path)
        swap.on_done(version)

    def _step(self, admitted: list[Sequence]) -> None:
        try:
            if admitted:
                self._prefill(admitted)
            if self._batch is not None:
                self._decode()
        except Exception as exc:  # the generation thread is a process boundary: fail the batch, keep serving
            logger.exception("generation step failed")
            self._fail_running(admitted, f"generation failed inside the engine: {exc}")

    def _forward(self, input_ids: Any, mask: Any, positions: Any, cache: Any) -> Any:
        model = self._model
        kwargs: dict[str, Any] = {model.cache_argument: cache}
        if model.logits_to_keep:
            kwargs["logits_to_keep"] = 1
        self._forward_passes += 1  # only this thread writes it; stats() reads a whole int
        with self._torch.inference_mode():
            output = model.model(
                input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs
            )
        return output.logits[:, -1, :]

    def _prefill(self, sequences: list[Sequence]) -> None:
        torch, device = self._torch, self._model.device
        lengths = [len(s.prompt_ids) for s in sequences]
        width = max(lengths)
        ids = torch.full((len(sequences), width), self._model.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        positions = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, (sequence, length) in enumerate(zip(sequences, lengths, strict=True)):
            ids[row, width - length :] = torch.tensor(sequence.prompt_ids, dtype=torch.long)
            mask[row, width - length :] = 1
            positions[row, width - length :] = torch.arange(length)
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        cache = new_cache()
        logits = self._forward(ids, mask, positions, cache)
        sample = self._sample(sequences, logits)
        fresh = BatchState(
            rows=list(sequences),
            cache=cache,
            mask=mask,
            positions=torch.tensor(lengths, dtype=torch.long, device=device),
            last_tokens=torch.tensor(sample.token_ids, dtype=torch.long, device=device),
        )
        self._record(sequences, sample)
        batch = fresh if self._batch is None else merge(self._batch, fresh)
        self._set_batch(self._retire(batch))

    def _decode(self) -> None:
        torch = self._torch
        batch = self._batch
        assert batch is not None
        ones = torch.ones((len(batch.rows), 1), dtype=batch.mask.dtype, device=batch.mask.device)
        mask = torch.cat([batch.mask, ones], dim=1)
        logits = self._forward(batch.last_tokens[:, None], mask, batch.positions[:, None], batch.cache)
        sample = self._sample(batch.rows, logits)
        batch.mask = mask
        batch.positions = batch.positions + 1
        batch.last_tokens = torch.tensor(sample.token_ids, dtype=torch.long, device=mask.device)
        self._record(batch.rows, sample)
        self._set_batch(self._retire(batch))

    def _set_batch(self, batch: BatchState | None) -> None:
        with self._cond:
            self._batch = batch

    def _sample(self, sequences: list[Sequence], logits: Any) -> StepSample:
        params = [s.params for s in sequences]
        generators = [s.generator for s in sequences]
        return sample_step(logits, params, generators, self._shared_generator)

    def _record(self, sequences: list[Sequence], sample: StepSample) -> None:
        for i, sequence in enumerate(sequences):
            if sequence.finish_reason is not None or sequence.cancelled:
                continue
            self._append_token(sequence, sample.token_ids[i], sample.logprobs[i], sample.top_logprobs[i])

    def _append_token(
        self, sequence: Sequence, token: int, logprob: float, top: list[tuple[int, float]]
    ) -> None:
        sequence.output_ids.append(token)
        sequence.logprobs.append(logprob)
        sequence.top_logprobs.append(top)
        self._check_finished(sequence, token)
        if sequence.stream:
            text = sequence.tracker.take_delta() if sequence.tracker is not None else ""
            sequence.sink(TokenEvent(token, logprob, top, text, self._version))
        if sequence.finish_reason is not None:
            self._finish(sequence)

    def _check_finished(self, sequence: Sequence, token: int) -> None:
        """Set the finish and stop reasons when ``token`` ends ``sequence`` (vLLM's rules)."""
        params = sequence.params
        # A stop token id stays in the token ids but adds no text, as in vLLM.
        stop_token = token in params.stop_token_ids
        tracker = sequence.tracker
        stopped = tracker.push(token) if tracker is not None and not stop_token else False
        total = len(sequence.prompt_ids) + len(sequence.output_ids)
        if not params.ignore_eos and token in self._model.eos_token_ids:
            sequence.finish_reason = "stop"
        elif stop_token:
            sequence.finish_reason, sequence.stop_reason = "stop", token
        elif stopped and tracker is not None:
            sequence.finish_reason, sequence.stop_reason = "stop", tracker.stop_string
        elif len(sequence.output_ids) >= params.max_tokens or total >= self._model.max_model_len:
            sequence.finish_reason = "length"

    def _finish(self, sequence: Sequence) -> None:
        if sequence.tracker is not None:
            text = sequence.tracker.finish()
        else:
            stop_token = isinstance(sequence.stop_reason, int)
            ids = sequence.output_ids[:-1] if stop_token else sequence.output_ids
            text = self._model.tokenizer.decode(ids, skip_special_tokens=True)
        assert sequence.finish_reason is not None
        event = FinishEvent(
            finish_reason=sequence.finish_reason,
            text=text,
            token_ids=list(sequence.output_ids),
            logprobs=list(sequence.logprobs),
            top_logprobs=list(sequence.top_logprobs),
            model_version=self._version,
            stop_reason=sequence.stop_reason,
        )
        sequence.sink(event)

    def _retire(self, batch: BatchState) -> BatchState | None:
        keep = [i for i, s in enumerate(batch.rows) if s.finish_reason is None and not s.cancelled]
        if len(keep) == len(batch.rows):
            return batch
        if not keep:
            return None
        return select(batch, keep)

    def _fail_running(self, admitted: list[Sequence], message: str) -> None:
        rows = list(self._batch.rows) if self._batch else []
        for sequence in {*rows, *admitted}:
            if sequence.finish_reason is None:
                sequence.finish_reason = "error"
                sequence.sink(ErrorEvent(message))
        self._set_batch(None)

    def _fail_all(self, message: str) -> None:
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        self._fail_running(waiting, message)
