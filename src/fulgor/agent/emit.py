"""What an agent reports about itself: rewards, messages, objects, exceptions and operations.

Each helper records one span (names and keys from :mod:`fulgor.semconv`) under the current
rollout; nested inside an ``operation`` it becomes that operation's child. In a program that a
:class:`~fulgor.runner.SubprocessAgent` runs there is no rollout in the process: there
``emit_reward`` posts the reward to ``$FULGOR_REWARD_URL`` instead.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
import os
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar, overload

from fulgor import semconv
from fulgor.agent.context import AgentError, RolloutContext, _current, current_context, new_span_id
from fulgor.types import Reward, Span, SpanStatus

__all__ = ["OperationHandle", "emit_exception", "emit_message", "emit_object", "emit_reward", "operation"]

_REWARD_URL_ENV = "FULGOR_REWARD_URL"
_POST_TIMEOUT_SECONDS = 30.0

P = ParamSpec("P")
R = TypeVar("R")


def _record(
    context: RolloutContext,
    name: str,
    attributes: dict[str, Any],
    *,
    start_time: float | None = None,
    span_id: str | None = None,
    status: SpanStatus | None = None,
) -> Span:
    now = time.time()
    if context.agent_name is not None:
        attributes = {semconv.ATTR_AGENT_NAME: context.agent_name, **attributes}
    span = Span(
        rollout_id=context.rollout_id,
        attempt_id=context.attempt_id,
        trace_id=context.trace_id,
        span_id=span_id or new_span_id(),
        parent_id=context.parent_span_id,
        name=name,
        start_time=now if start_time is None else start_time,
        end_time=now,
        attributes=attributes,
        status=status or SpanStatus(),
    )
    context.record(span)
    return span


def _json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise AgentError(f"{what} must be JSON-serialisable: {error}") from error


def emit_reward(
    value: float | Mapping[str, float], *, primary: str | None = None, feedback: str | None = None
) -> Reward:
    """Record a reward for the current rollout.

    A float is the reward. A mapping holds several named values; ``primary`` names the one training
    optimises (it may be omitted when the mapping has exactly one entry). ``feedback`` is the task's
    own words on the rollout (what was expected, what went wrong): prompt optimisation shows it to
    its critic, and every view of the rollout shows it. Outside any rollout but
    with ``$FULGOR_REWARD_URL`` set (in a program a SubprocessAgent runs) the reward is posted there;
    AgentError if the endpoint refuses it or cannot be reached.

    >>> emit_reward({"correct": 1.0, "format": 0.5}, primary="correct")  # doctest: +SKIP
    Reward(value=1.0, primary='correct', values={'correct': 1.0, 'format': 0.5})
    """
    reward = _to_reward(value, primary, feedback)
    context = _current.get()
    reward_url = os.environ.get(_REWARD_URL_ENV)
    if context is None and reward_url:
        _post_reward(reward_url, reward)
        return reward
    _record(
        current_context(),
        semconv.SPAN_REWARD,
        {
            semconv.ATTR_REWARD_VALUE: reward.value,
            semconv.ATTR_REWARD_PRIMARY: reward.primary,
            semconv.ATTR_REWARD_VALUES: reward.values,
            **({} if reward.feedback is None else {semconv.ATTR_REWARD_FEEDBACK: reward.feedback}),
        },
    )
    return reward


def _post_reward(url: str, reward: Reward) -> None:
    """Post ``reward`` to a SubprocessAgent's reward endpoint (the body it documents)."""
    # Imported here: urllib.request pulls in http.client and email, which `import fulgor` avoids.
    import urllib.error
    import urllib.request

    sent: dict[str, Any] = {"values": reward.values, "primary": reward.primary}
    if reward.feedback is not None:
        sent["feedback"] = reward.feedback
    body = json.dumps(sent).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    # The endpoint is the runner's, on loopback: never through an http_proxy from the environment,
    # which would see the rollout's reward URL and answer for the runner.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=_POST_TIMEOUT_SECONDS):
            return
    except urllib.error.HTTPError as error:
        raise AgentError(
            f"{_REWARD_URL_ENV} refused the reward (HTTP {error.code}): {_error_message(error.read())}"
        ) from None
    except OSError as error:  # URLError, refused connections and timeouts
        raise AgentError(
            f"could not post the reward to {_REWARD_URL_ENV}: {error}; is the runner that "
            "started this program still running?"
        ) from None


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, LookupError, TypeError):
        return body.decode(errors="replace")[:500]


def _to_reward(
    value: float | Mapping[str, float], primary: str | None, feedback: str | None = None
) -> Reward:
    if primary is not None and not isinstance(primary, str):
        raise AgentError(f"primary must be the name of a reward value (a string), got {primary!r}")
    if feedback is not None and not isinstance(feedback, str):
        raise AgentError(f"feedback must be text (a string), got {type(feedback).__name__}")
    if isinstance(value, Mapping):
        values = {str(k): _finite(v, f"reward {k!r}") for k, v in value.items()}
        if primary is None:
            if len(values) != 1:
                raise AgentError(f"emit_reward got {sorted(values)}: name the primary one with primary=...")
            primary = next(iter(values))
        if primary not in values:
            raise AgentError(f"primary={primary!r} is not among the reward values {sorted(values)}")
        return Reward(value=values[primary], primary=primary, values=values, feedback=feedback)
    reward = _finite(value, "reward")
    name = primary or "reward"
    return Reward(value=reward, primary=name, values={name: reward}, feedback=feedback)


def _finite(value: Any, what: str) -> float:
    # numbers.Real: numpy's and other libraries' scalars (numpy.float32 is no float) are numbers too.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AgentError(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise AgentError(f"{what} must be finite, got {number}")
    return number


def emit_message(message: str) -> None:
    """Record a free-text message (a log line that belongs to this rollout)."""
    _record(current_context(), semconv.SPAN_MESSAGE, {semconv.ATTR_MESSAGE_BODY: str(message)})


def emit_object(obj: Any) -> None:
    """Record any JSON-serialisable object (a parsed answer, a tool result, a score breakdown)."""
    text = _json_text(obj, "emit_object's argument")
    _record(current_context(), semconv.SPAN_OBJECT, {semconv.ATTR_OBJECT_JSON: text})


def emit_exception(error: BaseException) -> None:
    """Record an exception with its type, message and stack trace."""
    _record(
        current_context(),
        semconv.SPAN_EXCEPTION,
        {
            semconv.ATTR_EXCEPTION_TYPE: type(error).__qualname__,
            semconv.ATTR_EXCEPTION_MESSAGE: str(error),
            semconv.ATTR_EXCEPTION_STACKTRACE: "".join(traceback.format_exception(error)),
        },
        status=SpanStatus(code="error", message=str(error)),
    )


@dataclass
class OperationHandle:
    """The open operation inside ``with operation(...)``: set its output or extra attributes."""

    name: str
    span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)

    def set_output(self, output: Any) -> None:
        self.attributes[semconv.ATTR_OPERATION_OUTPUT] = _safe_json(output)

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = _safe_json(value)


def _safe_json(value: Any) -> Any:
    """The value if JSON can hold it, else its repr: operations record arguments of any type."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value


@contextmanager
def _operation_span(name: str, inputs: Any) -> Iterator[OperationHandle]:
    context = current_context()
    handle = OperationHandle(name=name, span_id=new_span_id())
    handle.attributes[semconv.ATTR_OPERATION_NAME] = name
    if inputs is not None:
        handle.attributes[semconv.ATTR_OPERATION_INPUT] = _safe_json(inputs)
    start = time.time()
    status = SpanStatus(code="ok")
    token = _current.set(replace(context, parent_span_id=handle.span_id))
    try:
        yield handle
    except BaseException as error:
        status = SpanStatus(code="error", message=f"{type(error).__qualname__}: {error}")
        raise
    finally:
        _current.reset(token)
        _record(
            context,
            semconv.SPAN_OPERATION,
            handle.attributes,
            start_time=start,
            span_id=handle.span_id,
            status=status,
        )


class _Operation:
    """``operation("name")``: a context manager, or a decorator for sync and async functions."""

    def __init__(self, name: str | None, inputs: Any) -> None:
        self._name = name
        self._inputs = inputs
        self._active: Any = None

    def __enter__(self) -> OperationHandle:
        self._active = _operation_span(self._name or "operation", self._inputs)
        handle: OperationHandle = self._active.__enter__()
        return handle

    def __exit__(self, *exc_info: Any) -> bool | None:
        active, self._active = self._active, None
        result: bool | None = active.__exit__(*exc_info)
        return result

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        name = self._name or func.__qualname__
        signature = inspect.signature(func)

        def inputs(*args: Any, **kwargs: Any) -> dict[str, Any]:
            bound = signature.bind_partial(*args, **kwargs)
            return dict(bound.arguments)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with _operation_span(name, inputs(*args, **kwargs)) as handle:
                    result = await func(*args, **kwargs)
                    handle.set_output(result)
                    return result

            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run_sync(*args: P.args, **kwargs: P.kwargs) -> R:
            with _operation_span(name, inputs(*args, **kwargs)) as handle:
                result = func(*args, **kwargs)
                handle.set_output(result)
                return result

        return run_sync


@overload
def operation(name: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def operation(name: str | None = None, /, *, inputs: Any = None) -> _Operation: ...
def operation(
    name: str | Callable[P, R] | None = None, /, *, inputs: Any = None
) -> _Operation | Callable[P, R]:
    """Record a timed step of the agent as a ``fulgor.operation`` span.

    As a decorator (``@operation`` or ``@operation("search")``) it records the function's arguments
    and return value; as a context manager (``with operation("search", inputs=q) as op:``) it
    records ``inputs`` and whatever ``op.set_output(...)`` receives. Spans emitted inside become its
    children. An exception marks the span as an error and propagates.
    """
    if callable(name):
        return _Operation(None, None)(name)
    return _Operation(name, inputs)
