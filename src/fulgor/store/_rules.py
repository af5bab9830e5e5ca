"""The state machines and checks every backend shares, as pure functions over wire models.

Backends decide where state lives; these functions decide what a change means, so the rules in
:mod:`fulgor.store.base` are written once.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from fulgor import limits, semconv
from fulgor.errors import InvalidTransitionError, ValidationError
from fulgor.limits import quoted
from fulgor.store.base import SpanList
from fulgor.types import (
    ATTEMPT_LIVE_STATUSES,
    ATTEMPT_TERMINAL_STATUSES,
    LLM,
    ROLLOUT_TERMINAL_STATUSES,
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    JsonDict,
    PromptTemplate,
    Resources,
    ResourcesVersion,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
)

T = TypeVar("T")
_MAX_PAGE = 2**53  # beyond this SQL backends overflow; no store holds that many rows anyway

_ATTEMPT_NEXT: dict[str, frozenset[str]] = {
    "preparing": frozenset({"preparing", "running", "succeeded", "failed", "timeout", "unresponsive"}),
    "running": frozenset({"running", "succeeded", "failed", "timeout", "unresponsive"}),
}


def new_rollout_id() -> str:
    return f"ro-{uuid.uuid4().hex[:16]}"


def new_attempt_id() -> str:
    return f"at-{uuid.uuid4().hex[:16]}"


def check_json(value: Any, field: str) -> str:
    """Serialise ``value`` to JSON as the store keeps it, or raise ValidationError naming ``field``
    and the limit it breaks (nesting past ``MAX_JSON_DEPTH``, a value that is not JSON, text that
    is not valid Unicode)."""
    problem = _json_problem(value)
    if isinstance(problem, str):
        raise ValidationError(f"{field} {problem}")
    return problem[0]


def nests_deeper_than(value: Any, max_depth: int) -> bool:
    """Whether ``value`` nests dicts and lists more than ``max_depth`` levels (``{}`` and ``[]`` are
    one level, a scalar none).

    Level by level, without recursion, and it stops at the first level past the limit: a value
    nested a million levels costs no more than one nested ``max_depth + 1``.
    """
    level: list[Any] = [value]
    depth = 0
    while True:
        below: list[Any] = []
        containers = False
        for item in level:
            if isinstance(item, dict):
                children: Any = item.values()
            elif isinstance(item, list | tuple):
                children = item
            else:
                continue
            containers = True
            # Long runs of scalars (token ids, logprobs) are checked in C rather than one by one.
            if len(children) > 8 and _SCALARS.issuperset(map(type, children)):
                continue
            below += [child for child in children if type(child) not in _SCALARS]
        if not containers:
            return False
        depth += 1
        if depth > max_depth:
            return True
        level = below


_SCALARS = frozenset({str, int, float, bool, type(None)})
_TOO_DEEP = (
    f"nests JSON more than {limits.MAX_JSON_DEPTH} levels deep, past fulgor.limits.MAX_JSON_DEPTH "
    "(stored, it could not be read back); flatten it"
)


def _json_problem(value: Any) -> tuple[str, int] | str:
    """``value`` as the store's JSON and its size in UTF-8 bytes, or why it cannot be stored."""
    if nests_deeper_than(value, limits.MAX_JSON_DEPTH):
        return _TOO_DEEP
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as error:
        return f"must be JSON-serialisable: {error}"
    if text.isascii():
        return text, len(text)
    try:
        return text, len(text.encode())
    except UnicodeEncodeError:
        return _NOT_UNICODE


_NOT_UNICODE = "holds a lone surrogate (text that is not valid Unicode, which no backend can store)"


def json_float(number: float) -> float | str:
    """A float as JSON can hold it: itself when finite, else the string OTLP/JSON writes for it."""
    if math.isfinite(number):
        return number
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def check_text(value: Any, field: str, max_chars: int = limits.MAX_ID_CHARS) -> None:
    """An id: a string of at most ``MAX_ID_CHARS`` characters without NUL characters (PostgreSQL's
    text cannot hold one) or lone surrogates (no database can)."""
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        limit = "MAX_NAME_CHARS" if max_chars == limits.MAX_NAME_CHARS else "MAX_ID_CHARS"
        raise ValidationError(
            f"{field} is {len(value)} characters long, past fulgor.limits.{limit} ({max_chars})"
        )
    if "\x00" in value:
        raise ValidationError(f"{field} must not contain NUL characters")
    if not value.isascii() and not _is_unicode(value):
        raise ValidationError(f"{field} {_NOT_UNICODE}")


def check_name(value: Any, field: str) -> None:
    """A name (a span's, a resource's): as :func:`check_text`, up to ``MAX_NAME_CHARS`` characters."""
    check_text(value, field, limits.MAX_NAME_CHARS)


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_ids(values: Sequence[str], field: str) -> None:
    """A list of ids, each checked as by :func:`check_text`."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ValidationError(f"{field} must be a list of ids, got {type(values).__name__}")
    for index, value in enumerate(values):
        check_text(value, f"{field}[{index}]")


def check_seconds(value: float, field: str) -> None:
    """A duration: a finite number, zero or more (NaN would pass ``< 0`` and never run out)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValidationError(f"{field} must be a finite number of seconds >= 0, got {quoted(value)}")


def check_requests(requests: Sequence[RolloutRequest]) -> None:
    for index, request in enumerate(requests):
        if not isinstance(request, RolloutRequest):
            raise ValidationError(f"requests[{index}] must be a RolloutRequest, got {type(request).__name__}")
        check_json(request.input, f"requests[{index}].input")
        check_json(request.metadata, f"requests[{index}].metadata")
        for field in ("group_id", "resources_id"):
            value = getattr(request, field)
            if value is not None:
                check_text(value, f"requests[{index}].{field}")


def check_worker_id(worker_id: str) -> None:
    if not isinstance(worker_id, str) or not worker_id or len(worker_id) > limits.MAX_ID_CHARS:
        raise ValidationError(
            f"worker_id must be a non-empty string of at most {limits.MAX_ID_CHARS} characters "
            "(fulgor.limits.MAX_ID_CHARS)"
        )
    check_text(worker_id, "worker_id")


def check_claim_args(worker_id: str, limit: int, wait_seconds: float) -> None:
    check_worker_id(worker_id)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValidationError(f"limit must be a positive integer, got {quoted(limit)}")
    check_seconds(wait_seconds, "wait_seconds")


def check_heartbeat(worker_id: str, stats: JsonDict | None, attempt_ids: Sequence[str] | None) -> None:
    check_worker_id(worker_id)
    if stats is not None:
        check_json(stats, "stats")
    if attempt_ids is not None:
        check_ids(attempt_ids, "attempt_ids")


def check_attempt_update(
    rollout_id: str,
    attempt_id: str,
    status: AttemptStatus | None,
    error: str | None,
    metadata: JsonDict | None,
) -> tuple[str | None, JsonDict | None]:
    """Check ``update_attempt``'s inputs; returns ``error`` and ``metadata`` as every backend stores them.

    An error is free text from whatever failed, so a NUL in it becomes U+FFFD rather than losing the
    report (PostgreSQL's text cannot hold NUL); metadata comes back as JSON gives it (lists, not tuples).
    """
    check_text(rollout_id, "rollout_id")
    check_text(attempt_id, "attempt_id")
    if status is not None and not isinstance(status, str):
        raise ValidationError(f"status must be an attempt status string, got {type(status).__name__}")
    if error is not None:
        if not isinstance(error, str):
            raise ValidationError(f"error must be a string, got {type(error).__name__}")
        error = _storable_text(error)
    if metadata is None:
        return error, None
    if not isinstance(metadata, dict):
        raise ValidationError(f"metadata must be a JSON object (a dict), got {type(metadata).__name__}")
    normalised: JsonDict = json.loads(check_json(metadata, "metadata"))
    return error, normalised


def _storable_text(text: str) -> str:
    """Free text with NUL characters and lone surrogates as U+FFFD, which every backend stores."""
    text = text.replace("\x00", "\ufffd")
    if text.isascii() or _is_unicode(text):
        return text
    return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)


def check_page(limit: int | None, offset: int, order: str = "asc") -> None:
    if order not in ("asc", "desc"):
        raise ValidationError(f"order must be 'asc' or 'desc', got {quoted(order)}")
    if limit is not None and not 0 <= limit <= _MAX_PAGE:
        raise ValidationError(f"limit must be between 0 and {_MAX_PAGE}, got {quoted(limit)}")
    if not 0 <= offset <= _MAX_PAGE:
        raise ValidationError(f"offset must be between 0 and {_MAX_PAGE}, got {quoted(offset)}")


def check_span_query(
    rollout_id: str, attempt_id: str | None, name: str | None, limit: int | None, offset: int
) -> None:
    check_page(limit, offset)
    check_text(rollout_id, "rollout_id")
    if attempt_id is not None:
        check_text(attempt_id, "attempt_id")
    if name is not None:
        check_name(name, "name")


_SPAN_ID_FIELDS = ("rollout_id", "attempt_id", "trace_id", "span_id", "parent_id")


def check_spans(spans: Sequence[Span]) -> None:
    """Every span's ids and name (:func:`check_text`), times, and what it carries (attributes, its
    events' attributes, its resource): JSON nested at most ``MAX_JSON_DEPTH`` levels, together at
    most ``MAX_SPAN_ATTRIBUTES_BYTES``."""
    # On every span add: a field's name is only put together once it is known to be wrong.
    for index, span in enumerate(spans):
        if not isinstance(span, Span):
            raise ValidationError(f"spans[{index}] must be a Span, got {type(span).__name__}")
        _check_span_text(span, index)
        size = _carried_size(span.attributes, index, "attributes")
        size += _carried_size(span.resource, index, "resource")
        for event_index, event in enumerate(span.events):
            size += _carried_size(event.attributes, index, f"events[{event_index}].attributes")
            _check_time(event.time, f"spans[{index}].events[{event_index}].time")
        if size > limits.MAX_SPAN_ATTRIBUTES_BYTES:
            raise ValidationError(
                f"spans[{index}] carries {size} bytes of attributes, event attributes and resource, "
                f"past fulgor.limits.MAX_SPAN_ATTRIBUTES_BYTES ({limits.MAX_SPAN_ATTRIBUTES_BYTES}); "
                "record less in one span"
            )
        if not math.isfinite(span.start_time):
            _check_time(span.start_time, f"spans[{index}].start_time")
        if span.end_time is not None and not math.isfinite(span.end_time):
            _check_time(span.end_time, f"spans[{index}].end_time")


def _check_span_text(span: Span, index: int) -> None:
    """The ids, name, status message and event names: fast when all is plain and short."""
    try:
        ids = (span.rollout_id, span.attempt_id, span.trace_id, span.span_id, span.parent_id or "")
        text = "".join((*ids, span.name, span.status.message or "", *(e.name for e in span.events)))
        short = max(map(len, ids)) <= limits.MAX_ID_CHARS and len(span.name) <= limits.MAX_NAME_CHARS
    except TypeError:  # a field that is not a string (a model built without validation)
        text, short = "", False
    if short and text.isascii() and "\x00" not in text:
        return
    for field in _SPAN_ID_FIELDS:
        value = getattr(span, field)
        if value is not None:
            check_text(value, f"spans[{index}].{field}")
    check_name(span.name, f"spans[{index}].name")
    others = [span.status.message or "", *(event.name for event in span.events)]
    if not all(not isinstance(other, str) or _is_unicode(other) for other in others):
        raise ValidationError(f"spans[{index}] has a status message or event name that {_NOT_UNICODE}")


def _carried_size(value: Any, index: int, field: str) -> int:
    problem = _json_problem(value)
    if isinstance(problem, str):
        raise ValidationError(f"spans[{index}].{field} {problem}")
    return problem[1]


def read_spans(bodies: Iterable[str | bytes]) -> SpanList:
    """Spans from the JSON bodies a backend stored; a body that no longer reads as a span (one an
    older version stored past today's limits) is skipped and counted in ``spans_unreadable``."""
    spans = SpanList()
    for body in bodies:
        try:
            spans.append(Span.model_validate_json(body))
        except ValueError:  # pydantic's ValidationError is one
            spans.spans_unreadable += 1
    return spans


def span_facts(span: Span) -> tuple[float | None, str | None]:
    """What a span tells of its rollout for filtering: the reward a ``fulgor.reward`` span
    gives (a finite number, else None), and the agent it names (its own agent attributes, or the
    agent a model call was made for), else None."""
    attributes = span.attributes
    reward = None
    if span.name == semconv.SPAN_REWARD:
        value = attributes.get(semconv.ATTR_REWARD_VALUE)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            reward = float(value)
    agent = None
    for key in semconv.AGENT_NAME_ATTRIBUTES:
        value = attributes.get(key)
        if isinstance(value, str) and value:
            agent = value
            break
    call = attributes.get(semconv.ATTR_MODEL_CALL) if span.name == semconv.SPAN_MODEL_CALL else None
    if agent is None and isinstance(call, dict):
        value = call.get("agent_name")
        agent = value if isinstance(value, str) and value else None
    return reward, agent


def stored_span(body: str | bytes, sequence_id: int, added: Span) -> Span:
    """The span a backend holds under ``added``'s span id (its body and sequence id), as re-adding
    it returns it; ``added`` with that sequence id when the stored body no longer reads."""
    try:
        return Span.model_validate_json(body)
    except ValueError:
        return added.model_copy(update={"sequence_id": sequence_id})


def _check_time(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise ValidationError(f"{field} must be a finite number, got {quoted(value)}")


def check_resources(resources: Resources, resources_id: str | None) -> None:
    if resources_id is not None and (
        not isinstance(resources_id, str) or not resources_id or len(resources_id) > 256
    ):
        raise ValidationError("resources_id must be a non-empty string of at most 256 characters, or None")
    if resources_id is not None:
        check_text(resources_id, "resources_id")
    if not isinstance(resources, dict):
        raise ValidationError(
            f"resources must be a dict of name -> LLM | PromptTemplate, got {type(resources).__name__}"
        )
    for name, resource in resources.items():
        if not isinstance(name, str) or not isinstance(resource, LLM | PromptTemplate):
            raise ValidationError(
                f"resources[{quoted(name)}] must be an LLM or a PromptTemplate keyed by a string"
            )
        check_name(name, f"resources[{quoted(name)}]")
        if isinstance(resource, LLM):
            check_json(resource.sampling_parameters, f"resources[{quoted(name)}].sampling_parameters")
        check_json(resource.model_dump(mode="json"), f"resources[{quoted(name)}]")


def check_cancellable(rollouts: Sequence[Rollout]) -> None:
    """A succeeded or failed rollout cannot be cancelled; then none of ``rollouts`` is."""
    for rollout in rollouts:
        if rollout.status in ("succeeded", "failed"):
            raise InvalidTransitionError("rollout", rollout.rollout_id, rollout.status, "cancelled")


def resources_version(
    resources: Resources, resources_id: str | None, version: int, now: float
) -> ResourcesVersion:
    """The stored form of a ``put_resources``: version ``version``, named ``resources-N`` unless named."""
    return ResourcesVersion(
        resources_id=resources_id or f"resources-{version}",
        version=version,
        resources=resources,
        create_time=now,
    )


def statuses_filter(status: str | Sequence[str] | None) -> frozenset[str] | None:
    if status is None:
        return None
    return frozenset({status} if isinstance(status, str) else status)


def rollout_from_request(request: RolloutRequest, now: float) -> Rollout:
    return Rollout(
        rollout_id=new_rollout_id(),
        input=request.input,
        mode=request.mode,
        group_id=request.group_id,
        resources_id=request.resources_id,
        config=request.config,
        metadata=request.metadata,
        status="queuing",
        enqueue_time=now,
    )


def begin_attempt(
    rollout: Rollout, worker_id: str, now: float, latest_resources_id: str | None
) -> tuple[Rollout, Attempt]:
    """A new ``preparing`` attempt for a queued rollout, and the rollout as it becomes."""
    if rollout.status not in ("queuing", "requeuing"):
        raise InvalidTransitionError("rollout", rollout.rollout_id, rollout.status, "preparing")
    attempt = Attempt(
        rollout_id=rollout.rollout_id,
        attempt_id=new_attempt_id(),
        sequence_id=rollout.attempt_count + 1,
        worker_id=worker_id,
        status="preparing",
        start_time=now,
        last_active_time=now,
    )
    updated = rollout.model_copy(
        update={
            "status": "preparing",
            "attempt_count": rollout.attempt_count + 1,
            "start_time": rollout.start_time if rollout.start_time is not None else now,
            "resources_id": rollout.resources_id or latest_resources_id,
        }
    )
    return updated, attempt


def attempted(rollout: Rollout, attempt: Attempt) -> AttemptedRollout:
    """``rollout`` with its ``attempt``, without validating either again."""
    return AttemptedRollout.model_construct(**rollout.__dict__, attempt=attempt)


def check_attempt_transition(attempt: Attempt, status: AttemptStatus) -> None:
    if status not in ATTEMPT_LIVE_STATUSES | ATTEMPT_TERMINAL_STATUSES:
        valid = ", ".join(sorted(ATTEMPT_LIVE_STATUSES | ATTEMPT_TERMINAL_STATUSES))
        raise ValidationError(f"status must be one of {valid}; got {quoted(status)}")
    if status not in _ATTEMPT_NEXT.get(attempt.status, frozenset()):
        raise InvalidTransitionError("attempt", attempt.attempt_id, attempt.status, status)


def rollout_after_attempt(rollout: Rollout, attempt: Attempt, now: float) -> Rollout:
    """The rollout once its latest attempt is in ``attempt.status``."""
    status: RolloutStatus
    if attempt.status in ATTEMPT_LIVE_STATUSES:
        status = "running" if attempt.status == "running" else "preparing"
        return rollout.model_copy(update={"status": status}) if rollout.status != status else rollout
    if attempt.status == "succeeded":
        status = "succeeded"
    elif attempt.status in rollout.config.retry_on and rollout.attempt_count < rollout.config.max_attempts:
        status = "requeuing"
    else:
        status = "failed"
    end_time = now if status in ROLLOUT_TERMINAL_STATUSES else None
    return rollout.model_copy(update={"status": status, "end_time": end_time})


def move_attempt(attempt: Attempt, status: AttemptStatus, now: float, error: str | None = None) -> Attempt:
    check_attempt_transition(attempt, status)
    update: dict[str, Any] = {"status": status, "last_active_time": now}
    if status not in ATTEMPT_LIVE_STATUSES:
        update["end_time"] = now
    if error is not None:
        update["error"] = error
    return attempt.model_copy(update=update)


def updated_attempt(
    attempt: Attempt,
    now: float,
    *,
    status: AttemptStatus | None = None,
    error: str | None = None,
    metadata: JsonDict | None = None,
) -> Attempt:
    """The attempt after ``update_attempt``: a status move, an error, merged metadata, activity."""
    if status is not None:
        updated = move_attempt(attempt, status, now, error)
    elif attempt.is_live:
        updated = attempt.model_copy(update={"last_active_time": now})
    else:
        updated = attempt
    if error is not None and status is None:
        updated = updated.model_copy(update={"error": error})
    if metadata is not None:
        updated = updated.model_copy(update={"metadata": {**updated.metadata, **metadata}})
    return updated


def overdue(attempt: Attempt, config: RolloutConfig, now: float) -> tuple[AttemptStatus, float] | None:
    """How and when the watchdog ends this live attempt, if one of its deadlines passed by ``now``.

    The deadline that passed first decides, even when the watchdog is applied later than that.
    """
    passed = [(when, status) for when, status in _deadlines(attempt, config) if when <= now]
    if not passed:
        return None
    when, status = min(passed)
    return status, when


def watchdog_deadline(attempt: Attempt, config: RolloutConfig) -> float | None:
    """When the watchdog next needs to look at this live attempt (None: never)."""
    return min((when for when, _ in _deadlines(attempt, config)), default=None)


def _deadlines(attempt: Attempt, config: RolloutConfig) -> list[tuple[float, AttemptStatus]]:
    deadlines: list[tuple[float, AttemptStatus]] = []
    if config.timeout_seconds is not None:
        deadlines.append((attempt.start_time + config.timeout_seconds, "timeout"))
    if config.unresponsive_seconds is not None:
        deadlines.append((attempt.last_active_time + config.unresponsive_seconds, "unresponsive"))
    return deadlines


WATCHDOG_ERRORS = {
    "timeout": "attempt exceeded config.timeout_seconds",
    "unresponsive": "no span, update or heartbeat within config.unresponsive_seconds",
}


class ChangeSignal:
    """Wakes coroutines waiting for the store to change, on any event loop or thread.

    Waiters remember the ``version`` they saw before checking state and sleep only if it has not
    moved since, so a change between the check and the sleep is never missed.
    """

    def __init__(self) -> None:
        self._version = 0
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def version(self) -> int:
        return self._version

    def notify(self) -> None:
        with self._lock:
            self._version += 1
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    async def wait(self, seen_version: int, timeout_seconds: float) -> None:
        """Return when the version moves past ``seen_version`` or the timeout passes."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._version != seen_version:
                return
            self._waiters.append((loop, future))
        try:
            # Not asyncio.wait_for: on Python 3.11 it drops a cancellation that arrives together
            # with the change, and the cancelled caller (a Ctrl+C) would go on waiting.
            async with asyncio.timeout(max(0.0, timeout_seconds)):
                await future
        except TimeoutError:
            pass
        finally:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_for_result(
    attempt_once: Callable[[], Awaitable[T | None]],
    signal: ChangeSignal,
    timeout_seconds: float,
    seconds_to_deadline: Callable[[], float | None],
    recheck_seconds: float | None = None,
) -> T | None:
    """Run ``attempt_once`` until it returns a result, sleeping on ``signal`` in between.

    Sleeps end at the next change, the next watchdog deadline (so timeouts fire while callers
    wait), ``recheck_seconds`` (for changes made by other processes, which no in-process signal
    sees), or the timeout, whichever comes first.
    """
    end = time.monotonic() + timeout_seconds
    while True:
        seen = signal.version
        result = await attempt_once()
        if result is not None:
            return result
        remaining = end - time.monotonic()
        if remaining <= 0:
            return None
        sleep = remaining
        to_deadline = seconds_to_deadline()
        if to_deadline is not None:
            sleep = min(sleep, max(to_deadline, 0.0) + 0.001)
        if recheck_seconds is not None:
            sleep = min(sleep, recheck_seconds)
        await signal.wait(seen, sleep)
