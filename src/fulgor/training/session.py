"""The rollouts a resource algorithm (prompt optimisation) runs, on the Trainer's services.

:class:`TrainerSession` is the Trainer's :class:`~fulgor.algorithms.base.RolloutSession`: the
algorithm names the tasks and the resources (its candidate prompts); the session publishes them
with the session's ``llm`` (the gateway, the model name, the sampling asked for) as a resources
version, so that every rollout records exactly what it ran with, runs one rollout per task on the
runners and reads each rollout's outcome once its calls are stored. A resources set already
published in this session is not published again. ``gateway_to`` serves a gateway of the run's
store in front of another model (an algorithm's critic), one per endpoint, until the session ends.
``agent_prompt_problem`` finds a prompt an agent could never receive, before anything runs.

What it does not know: which resources are better, or why they were asked for.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.agent.base import Agent, RolloutFunction, Runnable
from fulgor.credentials import new_operator_key
from fulgor.runner.worker import gateway_base_url
from fulgor.store.base import Store
from fulgor.training.rollouts import RolloutOutcome, run_rollouts
from fulgor.types import (
    LLM,
    JsonDict,
    PromptTemplate,
    Resource,
    Resources,
    RolloutConfig,
    RolloutMode,
    RolloutRequest,
)

if TYPE_CHECKING:
    from fulgor.gateway import Gateway
    from fulgor.training.services import Services

__all__ = ["TrainerSession", "agent_prompt_problem"]

OutcomeReader = Callable[["Services", list[Any]], Any]


@dataclass
class TrainerSession:
    """Runs rollouts with the resources an algorithm asks for; see the module docstring."""

    services: Services
    read_outcomes: OutcomeReader
    rollout_config: RolloutConfig
    run_dir: Path
    train: Sequence[Any]
    val: Sequence[Any]
    start_step: int
    stack: contextlib.AsyncExitStack[bool | None]
    rollouts_run: int = 0
    _published: dict[str, str] = field(default_factory=dict)
    _gateways: dict[tuple[str, str | None, float], ModelGateway] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        return self.services.store

    async def run(
        self,
        tasks: Sequence[Any],
        resources: Mapping[str, Resource],
        mode: RolloutMode,
        *,
        step: int,
        sampling_parameters: JsonDict | None = None,
    ) -> list[RolloutOutcome]:
        """One rollout of each task with ``resources`` and the session's ``llm``; their outcomes."""
        if not tasks:
            return []
        resources_id = await self.publish(resources, sampling_parameters or {})
        metadata = {"step": step} if step else {}
        requests = [
            RolloutRequest(
                input=task,
                mode=mode,
                resources_id=resources_id,
                config=self.rollout_config,
                metadata=metadata,
            )
            for task in tasks
        ]
        self.rollouts_run += len(requests)
        rollouts = await run_rollouts(self.store, requests, self.services.runners)
        outcomes: list[RolloutOutcome] = await self.read_outcomes(self.services, rollouts)
        return outcomes

    async def publish(self, resources: Mapping[str, Resource], sampling_parameters: JsonDict) -> str:
        """The resources id of ``resources`` with the session's ``llm``; put once per session."""
        llm = LLM(
            endpoint=f"{self.services.server_url}/v1",
            model=self.services.model_name,
            sampling_parameters=sampling_parameters,
        )
        full: Resources = {"llm": llm, **resources}
        key = json.dumps({name: r.model_dump(mode="json") for name, r in full.items()}, sort_keys=True)
        if key not in self._published:
            self._published[key] = (await self.store.put_resources(full)).resources_id
        return self._published[key]

    async def gateway_to(self, llm: LLM, *, timeout_seconds: float = 600.0) -> ModelGateway:
        """A recording gateway of the run's store in front of ``llm``'s endpoint, until the session
        ends; it gives up on a call after ``timeout_seconds``."""
        from fulgor.gateway import GatewayConfig, Upstream, create_gateway_app
        from fulgor.net.asgi import serve_asgi

        where = (llm.endpoint, llm.api_key, timeout_seconds)
        if where not in self._gateways:
            key = new_operator_key()
            upstream = Upstream(llm.endpoint, api_key=llm.api_key, request_token_ids=False)
            # No retries here: the caller retries, each try an attempt of its own.
            config = GatewayConfig(api_key=key, max_retries=0, read_timeout_seconds=timeout_seconds)
            gateway = create_gateway_app(self.store, [upstream], config)
            url = await self.stack.enter_async_context(serve_asgi(gateway))
            self._gateways[where] = ModelGateway(gateway, url, key, timeout_seconds)
        return self._gateways[where]


@dataclass(frozen=True)
class ModelGateway:
    """A gateway the session serves in front of one model (see ``TrainerSession.gateway_to``)."""

    gateway: Gateway
    url: str
    api_key: str
    timeout_seconds: float

    def base_url(self, rollout_id: str, attempt_id: str) -> str:
        return gateway_base_url(self.url, rollout_id, attempt_id)

    async def settle(self, rollout_id: str) -> None:
        await self.gateway.settle([rollout_id], self.timeout_seconds)


def agent_prompt_problem(agent: Runnable, resources: Mapping[str, Any]) -> str | None:
    """Why a prompt in ``resources`` could never reach ``agent``, or None when each can (or when
    the agent takes every resource: ``resources``, ``**kwargs``, a program run as a subprocess)."""
    parameters = _resource_parameters(agent)
    if parameters is None:
        return None
    unused = sorted(
        name for name, r in resources.items() if isinstance(r, PromptTemplate) and name not in parameters
    )
    if not unused:
        return None
    listed = ", ".join(sorted(parameters)) or "none"
    return (
        f"the agent {agent.name!r} takes no parameter named {', '.join(map(repr, unused))}, so that "
        f"prompt would never reach it (its parameters: {listed}); name the prompt after the agent's "
        "parameter, or add a parameter of that name (or `resources`) to the agent"
    )


def _resource_parameters(agent: Runnable) -> set[str] | None:
    """The parameter names through which ``agent`` receives resources; None when it gets them all."""
    if isinstance(agent, RolloutFunction):
        function: Callable[..., Any] = agent.func
    elif isinstance(agent, Agent):
        function = agent.rollout
    else:
        return None
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is p.VAR_KEYWORD or p.name == "resources" for p in parameters):
        return None
    return {p.name for p in parameters if p.name not in ("task", "rollout")}
