"""Agents as fulgor runs them: a ``@rollout`` function or an ``Agent`` subclass.

Either way the agent's code stays its own. fulgor calls it once per rollout with what its
signature asks for, by parameter name: ``task`` (the rollout's input), ``rollout`` (the Rollout
record), ``resources`` (every resource by name), or any resource by its own name — ``llm`` (the
per-rollout gateway endpoint) and ``prompt_template`` by convention. The agent returns a float
reward, or None when it reported its reward with ``emit_reward`` (or has none).

What this module does not know: how rollouts are claimed, timed out or retried (the runner's job).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import numbers
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, overload, runtime_checkable

from fulgor.agent.context import AgentError
from fulgor.agent.emit import emit_reward
from fulgor.types import Resource, Rollout

__all__ = ["Agent", "RolloutFunction", "Runnable", "rollout"]

_BUILTIN_ARGUMENTS = ("task", "rollout", "resources")


@runtime_checkable
class Runnable(Protocol):
    """What a runner needs from an agent: a name and one coroutine per rollout."""

    name: str

    async def run(self, task: Any, resources: Mapping[str, Resource], rollout: Rollout) -> float | None:
        """Run one rollout; the returned float (if any) has already been emitted as its reward."""
        ...


def _arguments(
    func: Callable[..., Any], task: Any, resources: Mapping[str, Resource], rollout: Rollout
) -> dict[str, Any]:
    """Bind ``func``'s parameters by name; a required one that nothing provides is an AgentError."""
    available: dict[str, Any] = {**resources, "task": task, "rollout": rollout, "resources": dict(resources)}
    arguments: dict[str, Any] = {}
    for parameter in inspect.signature(func).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in available:
            arguments[parameter.name] = available[parameter.name]
        elif parameter.default is parameter.empty:
            names = sorted({*resources, *_BUILTIN_ARGUMENTS})
            raise AgentError(
                f"agent parameter {parameter.name!r} has no value: an agent can ask for {names}; "
                "add a resource of that name or give the parameter a default"
            )
    return arguments


async def _call(func: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    """Await an async agent; run a sync one in a thread with the current context copied."""
    if inspect.iscoroutinefunction(func):
        return await func(**arguments)
    context = contextvars.copy_context()
    result = await asyncio.to_thread(context.run, functools.partial(func, **arguments))
    if inspect.isawaitable(result):
        return await result
    return result


def _reward_from(result: Any, name: str) -> float | None:
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        raise AgentError(f"agent {name!r} returned {type(result).__name__}; return a float reward or None")
    return emit_reward(float(result)).value


class RolloutFunction:
    """A function made into an agent by ``@rollout``; calling it directly still calls the function."""

    def __init__(self, func: Callable[..., Any], name: str | None = None) -> None:
        self.func = func
        self.name = name or func.__name__
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    async def run(self, task: Any, resources: Mapping[str, Resource], rollout: Rollout) -> float | None:
        result = await _call(self.func, _arguments(self.func, task, resources, rollout))
        return _reward_from(result, self.name)


@overload
def rollout(func: Callable[..., Any], /) -> RolloutFunction: ...
@overload
def rollout(*, name: str | None = None) -> Callable[[Callable[..., Any]], RolloutFunction]: ...
def rollout(
    func: Callable[..., Any] | None = None, /, *, name: str | None = None
) -> RolloutFunction | Callable[[Callable[..., Any]], RolloutFunction]:
    """Make a sync or async function an agent fulgor can run (see the module docstring).

    >>> @rollout
    ... def solve(task, llm):
    ...     return 1.0 if task["answer"] == 4 else 0.0
    >>> solve.name
    'solve'
    """
    if func is not None:
        return RolloutFunction(func)
    return lambda f: RolloutFunction(f, name)


class Agent:
    """Base class for class-based agents: implement ``rollout`` (sync or async).

    ``rollout``'s parameters are bound by name like a ``@rollout`` function's. ``name`` defaults
    to the class name; multi-agent systems use it to choose which agents to train.
    """

    name: str = ""

    def __init__(self) -> None:
        if not self.name:
            self.name = type(self).__name__

    # Subclasses define ``rollout`` with whatever parameters they need; it is not declared here so
    # that those signatures do not have to match a base signature.
    rollout: Callable[..., float | Awaitable[float | None] | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not callable(getattr(cls, "rollout", None)):
            raise TypeError(f"{cls.__name__} must define rollout(self, task, ...) to be an Agent")

    async def run(self, task: Any, resources: Mapping[str, Resource], rollout: Rollout) -> float | None:
        result = await _call(self.rollout, _arguments(self.rollout, task, resources, rollout))
        return _reward_from(result, self.name)
