"""Recorder: turns finished calls into ``fulgor.model_call`` spans, written off the response path.

A call reserves a slot before it goes upstream and hands its :class:`CallRecord` over when it ends;
a background task parses the response, builds one span per choice and hands the spans to a
:class:`~fulgor.store.writer.SpanWriter`, which writes them in batches with the one policy every
span writer follows (failures that may pass retried with backoff; a span finally not written
logged and counted in ``spans_lost``, never lost silently). A slot is released once its spans are
with the writer, and the writer holds at most ``queue_size`` unwritten spans before it makes the
recorder wait, so a slow store makes new calls wait for a slot (backpressure) instead of growing
memory.

A call becomes training data only when its ids can be trusted: a call with ids missing, or with
fewer or more response ids than the upstream's ``usage.completion_tokens``, is flagged
``token_ids_missing``; a streamed choice that never got a ``finish_reason`` and a stream that
carried an error chunk are recorded as errors, without ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import orjson

from fulgor import semconv
from fulgor.gateway.extract import (
    BadEventError,
    ChoiceRecord,
    Endpoint,
    SseParser,
    StreamAccumulator,
    choices_from_body,
)
from fulgor.store.base import Store
from fulgor.store.writer import SpanWriter
from fulgor.types import ModelCall, Span, SpanStatus

__all__ = ["CallRecord", "Recorder"]

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]


@dataclass
class CallRecord:
    """One call as the gateway saw it, before parsing (parsing happens off the response path)."""

    rollout_id: str
    attempt_id: str
    endpoint: Endpoint
    request: JsonDict
    start_time: float
    replica: str | None = None
    status: int | None = None
    body: bytes | None = None
    stream_chunks: list[bytes] | None = None
    error: str | None = None
    end_time: float | None = None
    latency_seconds: float | None = None
    agent_name: str | None = None
    trace_id: str | None = None
    parent_id: str | None = None
    model_version: int | None = None
    requested_model: str | None = None


class Recorder:
    """Turns finished calls into spans off the response path and hands them to a span writer."""

    def __init__(
        self,
        store: Store,
        *,
        queue_size: int = 4096,
        batch_size: int = 256,
        linger_seconds: float = 0.01,
        retry_seconds: float = 30.0,
    ) -> None:
        self.writer = SpanWriter(
            store,
            batch_size=batch_size,
            linger_seconds=linger_seconds,
            max_pending=queue_size,
            retry_seconds=retry_seconds,
        )
        self._slots = asyncio.Semaphore(queue_size)
        self._queue: asyncio.Queue[CallRecord] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._missing_warned: set[tuple[str | None, bool]] = set()
        self._submitted = 0
        self._handed_over = 0
        self._handed = asyncio.Event()
        self.token_ids_missing = 0

    def start(self) -> None:
        if self._task is None:
            self.writer.start()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fulgor-gateway-recorder")

    async def reserve(self) -> None:
        """Wait for a free slot; every reserve is followed by exactly one :meth:`submit` or
        :meth:`unreserve`."""
        await self._slots.acquire()

    def unreserve(self) -> None:
        """Give a reserved slot back without a record (the call was refused before it went out)."""
        self._slots.release()

    def submit(self, record: CallRecord) -> None:
        self._submitted += 1
        self._queue.put_nowait(record)

    @property
    def pending(self) -> int:
        """Calls not yet turned into spans, and spans not yet written."""
        return self._queue.qsize() + self.writer.pending

    async def caught_up(self) -> None:
        """Wait until every call submitted before now has been written (or counted as lost); calls
        submitted meanwhile do not hold it up. One task turns calls into spans in submission order,
        so a count is enough."""
        target = self._submitted
        while self._handed_over < target:
            await self._handed.wait()
        await self.writer.flush()

    async def close(self) -> None:
        """Write everything submitted (retrying as the writer does), then stop."""
        if self._task is None:
            return
        await self.caught_up()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self.writer.close()

    async def _run(self) -> None:
        while True:
            record = await self._queue.get()
            try:
                await self.writer.put(self._build(record))
            finally:
                self._slots.release()
                self._handed_over += 1
                handed, self._handed = self._handed, asyncio.Event()
                handed.set()

    def _build(self, record: CallRecord) -> list[Span]:
        try:
            return self.spans_for(record)
        except Exception:  # a bug here must not stop the recorder: the call is counted as lost
            self.writer.count_lost(record.rollout_id)
            logger.exception(
                "could not build the model call span of rollout %s attempt %s; counted in spans_lost",
                record.rollout_id,
                record.attempt_id,
            )
            return []

    def spans_for(self, record: CallRecord) -> list[Span]:
        """The spans of one call: one per sampled choice, or one that records the error."""
        parsed = _parse(record) if record.error is None else _Parsed()
        error = record.error or parsed.error
        if error is not None or not parsed.choices:
            error = error or _error_text(record)
            return [self._span(record, ModelCall(**_what_was_sent(record), error=error), 0)]
        counts = _ids_against_usage(parsed)
        calls = [
            self._model_call(record, choice, streamed=parsed.streamed, counts=counts)
            for choice in parsed.choices
        ]
        return [self._span(record, call, index) for index, call in enumerate(calls)]

    def _model_call(
        self, record: CallRecord, choice: ChoiceRecord, *, streamed: bool, counts: tuple[int, int] | None
    ) -> ModelCall:
        """``counts`` is (ids returned, usage.completion_tokens) when the call's ids disagree with
        its usage."""
        common = _what_was_sent(record)
        common["response"] = choice.response
        if choice.model_version is not None:  # the engine's own word on the weights that served it
            common["model_version"] = choice.model_version
        if streamed and choice.response.get("finish_reason") is None:
            # Recorded as an error, not as token_ids_missing: the upstream did return ids, but the
            # stream stopped before the choice did, so its ids are a cut-off sample. It is a failed
            # call (the agent did not get a whole answer either), and token_ids_missing would
            # blame the upstream's id support in the stats and the warning. No ids are kept, so it
            # never becomes training data.
            return ModelCall(**common, error=_UNFINISHED)
        missing = counts is not None or choice.prompt_token_ids is None or choice.response_token_ids is None
        logprobs = choice.response_logprobs
        if missing or (logprobs is not None and len(logprobs) != len(choice.response_token_ids or ())):
            logprobs = None
        if missing:
            self._note_missing(record.replica, counts)
        return ModelCall(
            **common,
            prompt_token_ids=None if missing else choice.prompt_token_ids,
            response_token_ids=None if missing else choice.response_token_ids,
            response_logprobs=logprobs,
            token_ids_missing=missing,
        )

    def _note_missing(self, replica: str | None, counts: tuple[int, int] | None) -> None:
        """Count a call flagged ``token_ids_missing``; warn once per replica and cause. ``counts``
        is (ids returned, usage.completion_tokens) when the ids disagree with the usage."""
        self.token_ids_missing += 1
        key = (replica, counts is not None)
        if key in self._missing_warned:
            return
        self._missing_warned.add(key)
        if counts is None:
            logger.warning(
                "upstream %s returned no token ids; its calls are recorded with token_ids_missing and "
                "will not be trained on (serve with vLLM >= 0.10.2 or fulgor's engine)",
                replica,
            )
        else:
            logger.warning(
                "upstream %s returned %d response token ids where its usage counts %d completion "
                "tokens; such calls are recorded with token_ids_missing and will not be trained on "
                "(vLLM's tool and reasoning parsers dropped ids of held-back deltas in streams, "
                "vLLM issue #27482; upgrade vLLM or fulgor's engine)",
                replica,
                *counts,
            )

    def _span(self, record: CallRecord, call: ModelCall, index: int) -> Span:
        # The ModelCall is the one home of what the call was (agent name, token_ids_missing included).
        attributes: JsonDict = {semconv.ATTR_MODEL_CALL: call.model_dump(mode="json")}
        return Span(
            rollout_id=record.rollout_id,
            attempt_id=record.attempt_id,
            trace_id=record.trace_id or os.urandom(16).hex(),
            span_id=os.urandom(8).hex(),
            parent_id=record.parent_id,
            name=semconv.SPAN_MODEL_CALL,
            start_time=record.start_time,
            end_time=max(record.end_time or record.start_time, record.start_time),
            attributes=attributes,
            status=SpanStatus(code="error", message=call.error) if call.error else SpanStatus(code="ok"),
            resource={
                semconv.RESOURCE_ROLLOUT_ID: record.rollout_id,
                semconv.RESOURCE_ATTEMPT_ID: record.attempt_id,
            },
        )


def _what_was_sent(record: CallRecord) -> JsonDict:
    """The ModelCall fields every span of a call shares, whatever the upstream answered."""
    return {
        "request": record.request,
        "engine_replica": record.replica,
        "model_version": record.model_version,
        "latency_seconds": record.latency_seconds,
        "agent_name": record.agent_name,
        "requested_model": record.requested_model,
    }


_UNFINISHED = (
    "the stream ended before this choice finished (no finish_reason); its token ids are incomplete "
    "and it is not trained on"
)


@dataclass
class _Parsed:
    """What a response says: its choices, its usage and, for a stream, any error chunk."""

    choices: list[ChoiceRecord] = field(default_factory=list)
    usage: Any = None
    error: str | None = None
    streamed: bool = False


def _parse(record: CallRecord) -> _Parsed:
    try:
        return _parse_answer(record)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as error:
        # A list where a chat completion has an object, a number where it has text: the call is
        # recorded as failed rather than dropped (and never trained on).
        return _Parsed(
            error=f"the upstream's answer is not a chat completion ({type(error).__name__}: {error})",
            streamed=record.stream_chunks is not None,
        )


def _parse_answer(record: CallRecord) -> _Parsed:
    if record.status != 200:
        return _Parsed()
    if record.stream_chunks is not None:
        parser = SseParser()
        accumulator = StreamAccumulator(record.endpoint)
        try:
            for chunk in record.stream_chunks:
                for event in parser.feed(chunk):
                    accumulator.add(event)
        except BadEventError as bad:
            # A pass-through stream (a translating relay has already ended its stream and set
            # record.error): the agent got the event as it came; the call is an error, not dropped.
            return _Parsed(error=str(bad), streamed=True)
        error = None if accumulator.error is None else f"upstream error mid-stream: {accumulator.error}"
        return _Parsed(accumulator.records(), accumulator.usage, error, streamed=True)
    try:
        body = orjson.loads(record.body or b"null")
    except orjson.JSONDecodeError:
        return _Parsed()  # recorded as "no choices"
    if not isinstance(body, dict):
        return _Parsed()
    return _Parsed(choices_from_body(record.endpoint, body), body.get("usage"))


def _ids_against_usage(parsed: _Parsed) -> tuple[int, int] | None:
    """(ids returned, usage.completion_tokens) when they differ, else None.

    Ids can go missing with their logprobs, so the two lengths still agree: vLLM's streamed chat
    with a tool or reasoning parser dropped both for the deltas the parser held back (vLLM issue
    #27482, fixed by PR #29074). The usage counts every sampled token. With n > 1 it counts all
    choices together, so the sum is compared and a mismatch flags every choice of the call.
    """
    expected = parsed.usage.get("completion_tokens") if isinstance(parsed.usage, dict) else None
    if not isinstance(expected, int) or isinstance(expected, bool):
        return None
    ids = [choice.response_token_ids for choice in parsed.choices]
    if any(choice_ids is None for choice_ids in ids):
        return None
    returned = sum(len(choice_ids or ()) for choice_ids in ids)
    return None if returned == expected else (returned, expected)


def _error_text(record: CallRecord) -> str:
    if record.status != 200 and record.body:
        return f"upstream answered {record.status}: {record.body[:500].decode('utf-8', 'replace')}"
    return f"upstream answered {record.status} with no choices"
