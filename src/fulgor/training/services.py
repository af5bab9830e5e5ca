"""The services a training run needs, started together and stopped together.

``start_services`` loads the local engine and serves it on a thread of its own (given a
:class:`~fulgor.engine.vllm.VLLMConfig`, starts and supervises vLLM instead, or uses the running
one its ``url`` names; given an :class:`~fulgor.gateway.Upstream`, sends the agent's calls to that
OpenAI-compatible server, whose weights it never changes), serves the store API and the gateway
from one app on the caller's event loop (so the trainer can pause, drain and flush the gateway and
use the store directly), and starts the runners. A fresh operator key guards the session: the
runners get it, their agents only the credentials of their own attempts. Leaving the block stops
runners, then the server (the gateway writes what it still holds), then the engine, then closes
the store when the session owns it: no process or port is left, whatever happened inside. A store
the caller owns stays open, for it to use again. ``open_run_store`` opens the run directory's
SQLite store for a new session.

What it does not know: which algorithm runs or what a training step is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.agent.base import Runnable
from fulgor.credentials import new_operator_key
from fulgor.errors import ConfigError
from fulgor.runner.worker import RunnerConfig
from fulgor.store.base import Store
from fulgor.training.runners import KubernetesRunners, RayRunners, RunnerGroup, runners_url, start_runners

if TYPE_CHECKING:
    from fulgor.engine.local import EngineConfig, LocalEngine
    from fulgor.engine.vllm import VLLMConfig, VLLMServer
    from fulgor.gateway import Gateway, Upstream

__all__ = ["Services", "check_vllm_updates", "open_run_store", "start_services", "trainer_upstream"]

logger = logging.getLogger(__name__)

_DRAIN_TIMEOUT_SECONDS = 60.0


@dataclass
class Services:
    """What a running session holds: the store, the engine (the local one, or vLLM's supervisor;
    None on an upstream the session does not own), the gateway, their URLs, the runners, and the
    name the model is served under (on vLLM, a LoRA adapter's name changes with each version)."""

    store: Store
    engine: LocalEngine | VLLMServer | None
    gateway: Gateway
    server_url: str
    engine_url: str
    runners: RunnerGroup
    model_name: str
    adapters: dict[str, LocalEngine] = field(default_factory=dict)
    """With one LoRA adapter per agent: the engine serving each adapter, by adapter name."""

    @property
    def model_version(self) -> int | None:
        """The version of the weights the local engine serves (the adapters' when there are any:
        the base never changes then); None for an upstream's."""
        if self.adapters:
            return max(engine.model_version for engine in self.adapters.values())
        return None if self.engine is None else self.engine.model_version

    @property
    def agent_models(self) -> dict[str, str]:
        """The model name each adapter is served under, by adapter name (``LLM.agent_models``)."""
        return {name: engine.model_name for name, engine in self.adapters.items()}

    async def settle_calls(self, rollout_ids: Sequence[str] | None = None) -> None:
        """Wait until no model call is in flight and every recorded call is in the store; with
        ``rollout_ids``, only the calls of those rollouts (other rollouts' calls go on)."""
        if not await self.gateway.settle(rollout_ids, _DRAIN_TIMEOUT_SECONDS):
            logger.warning("model calls still in flight after %.0fs", _DRAIN_TIMEOUT_SECONDS)

    async def swap_weights(self, checkpoint: str, *, pause: bool = True) -> int:
        """Pause the gateway, let calls in flight finish, load ``checkpoint`` into the engine, resume.

        Returns the engine's new model version; calls made after this return are served by it and
        recorded with it. Without ``pause`` calls keep arriving (rollouts run while the policy
        trains): the engine lets the calls it is running finish on the old weights and holds new
        ones until the new weights serve, and each call records the version its engine response
        names. vLLM names no version in its responses and would serve a call running across the
        reload with both, so on vLLM the gateway always pauses (new calls get 429 and Retry-After
        for as long as the reload takes).
        """
        from fulgor.engine.local import LocalEngine

        if self.engine is None:
            raise ConfigError("the session's model is an upstream server: there are no weights to swap")
        if not pause and isinstance(self.engine, LocalEngine):
            version = await self._swap(checkpoint)
            self.gateway.model_version = version
            return version
        self.gateway.pause()
        try:
            await self.settle_calls()
            version = await self._swap(checkpoint)
        finally:
            self.gateway.resume(model_version=self.model_version)
        return version

    async def _swap(self, checkpoint: str) -> int:
        """Load the checkpoint: into the engine, or each of its adapters into that adapter's engine."""
        from fulgor.engine.local import LocalEngine

        assert self.engine is not None
        if not isinstance(self.engine, LocalEngine):  # vLLM: in place, or an adapter under a new name
            version = await asyncio.to_thread(self.engine.reload_weights, checkpoint)
            self.model_name = self.engine.model_name
            return version
        if not self.adapters:
            return (await self.engine.swap_weights(checkpoint)).model_version
        swaps = [await engine.swap_weights(Path(checkpoint) / name) for name, engine in self.adapters.items()]
        return max(swap.model_version for swap in swaps)


@contextlib.asynccontextmanager
async def start_services(
    store: Store,
    engine_config: EngineConfig | VLLMConfig | Upstream,
    agent: Runnable,
    n_runners: int,
    runner_config: RunnerConfig,
    runner_log: Path,
    *,
    owns_store: bool,
    model_name: str | None = None,
    adapters: Mapping[str, Path] | None = None,
    runners_backend: RayRunners | KubernetesRunners | None = None,
    runner_python: str | None = None,
) -> AsyncIterator[Services]:
    """Start engine, server + gateway and runners; stop them all on leaving, in reverse order.

    With ``owns_store`` the store is closed last; without, it is left open for its owner. Given an
    ``Upstream`` instead of an engine config, no engine starts: the gateway sends every call there,
    served as ``model_name``. ``adapters`` (a name and a model directory each: the base, or a LoRA
    adapter over it) are served beside the model as ``MODEL-NAME``, each on an engine of its own.
    ``runners_backend`` runs the runners as Ray actors instead of local processes, or each attempt as
    a Kubernetes Job (the server then listens where its ``listen_host`` and ``listen_port`` say, and
    they reach it at its ``server_url``).
    Given a ``VLLMConfig``, vLLM serves the model (started, or attached to by ``url``, and stopped last).
    ``runner_python`` runs the runner processes on that Python instead of this one.
    """
    from fulgor.engine.vllm import VLLMConfig
    from fulgor.gateway import GatewayConfig, Upstream, create_gateway_app
    from fulgor.net.asgi import ServerThread, serve_asgi
    from fulgor.server import ServerConfig, create_app

    async with contextlib.AsyncExitStack() as stack:
        if owns_store:  # closed last, after the server that serves it
            stack.push_async_callback(store.close)
        engine: LocalEngine | VLLMServer | None = None
        served_adapters: dict[str, LocalEngine] = {}
        if isinstance(engine_config, Upstream):
            upstream, served = engine_config, model_name
            if served is None:
                raise ConfigError("an upstream needs the model_name to serve its calls with")
        elif isinstance(engine_config, VLLMConfig):
            if adapters:
                raise ConfigError(
                    "one LoRA adapter per agent is served by the local engine only; train a single "
                    "adapter or full weights on vLLM, or use engine=EngineConfig(model=DIR)"
                )
            engine = await stack.enter_async_context(_start_vllm(engine_config))
            upstream = Upstream(f"{engine.url}/v1", api_key=engine_config.api_key)
            served = engine.model_name
        else:
            from fulgor.engine.app import create_app as create_engine_app
            from fulgor.engine.local import LocalEngine

            engine = await asyncio.to_thread(LocalEngine.from_config, engine_config)
            for name, path in (adapters or {}).items():
                config = replace(engine_config, model=path, served_model_name=f"{engine.model_name}-{name}")
                served_adapters[name] = await asyncio.to_thread(LocalEngine.from_config, config)
            engine_server = ServerThread(create_engine_app(engine, adapters=list(served_adapters.values())))
            stack.push_async_callback(engine_server.astop)
            upstream = Upstream(f"{await asyncio.to_thread(engine_server.start)}/v1")
            served = engine.model_name
        # One operator key per session: the runners use it, each agent gets its attempt's credential.
        key = new_operator_key()
        gateway_config = GatewayConfig(
            api_key=key, model_version=None if engine is None else engine.model_version
        )
        gateway = create_gateway_app(store, [upstream], gateway_config)
        # The session closes the store itself (last) when it owns it, else leaves it to its owner.
        app = create_app(ServerConfig(store=store, gateway=gateway, token=key, close_store=False))
        sock = None
        if runners_backend is not None:  # where the actors or the Jobs' pods reach it
            from fulgor.net.sockets import bind_socket

            sock = bind_socket(runners_backend.listen_host, runners_backend.listen_port)
        served_at = serve_asgi(app, sock, on_shutdown=app.draining.begin)
        server_url = await stack.enter_async_context(served_at)
        reached_at = runners_url(runners_backend, server_url)
        runner_config = replace(runner_config, gateway_url=reached_at, operator_key=key)
        runners: RunnerGroup
        if isinstance(runners_backend, KubernetesRunners):
            runners = await runners_backend.start(agent, store, reached_at, n_runners, runner_config)
            logger.info("started %s", runners.description)
        else:
            runners = start_runners(
                agent,
                store,
                reached_at,
                n_runners,
                runner_config,
                runner_log,
                backend=runners_backend,
                python=runner_python,
            )
        stack.push_async_callback(runners.stop)
        where = "upstream" if engine is None else "engine"
        logger.info("%s at %s, store and gateway at %s", where, upstream.url, server_url)
        yield Services(store, engine, gateway, server_url, upstream.url, runners, served, served_adapters)


@contextlib.asynccontextmanager
async def _start_vllm(config: VLLMConfig) -> AsyncIterator[VLLMServer]:
    """vLLM's supervisor, started (or attached to the server at ``config.url``) and stopped on
    leaving, whatever happens inside."""
    from fulgor.engine.vllm import VLLMServer

    server = VLLMServer(config)
    try:
        await asyncio.to_thread(server.start)
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def open_run_store(run_dir: Path) -> Store:
    """The run directory's own store, without the rollouts an interrupted session left unfinished
    (cancelled, so that new runners do not pick them up)."""
    from fulgor.store.sqlite import SqliteStore

    store = SqliteStore(run_dir / "store.sqlite")
    try:
        unfinished = await store.query_rollouts(status=["queuing", "requeuing", "preparing", "running"])
        if unfinished:
            logger.info("cancelling %d rollouts left unfinished by an earlier session", len(unfinished))
            await store.cancel([rollout.rollout_id for rollout in unfinished])
    except BaseException:
        await store.close()
        raise
    return store


def check_vllm_updates(algorithm: Any, engine: EngineConfig | VLLMConfig | None) -> None:
    """On vLLM, an algorithm whose updates it can serve, or a ConfigError saying what to change."""
    from fulgor.engine.vllm import VLLMConfig

    lora = getattr(algorithm, "lora", None) is not None
    if isinstance(engine, VLLMConfig) and lora and getattr(algorithm, "async_rollouts", False):
        raise ConfigError(
            "async_rollouts with a LoRA adapter on vLLM: each update's adapter is served under a name "
            "of its own and the one before is unloaded, so rollouts running across a publish would "
            "lose their model; train full weights (lora=None) or turn async_rollouts off"
        )


def trainer_upstream(
    engine: EngineConfig | VLLMConfig | None,
    upstream: str | Upstream | None,
    api_key: str | None,
    model: str | None,
) -> Upstream | None:
    """The upstream the trainer sends calls to, or None for the local engine; exactly one is given."""
    if (engine is None) == (upstream is None):
        raise ConfigError(
            "pass either engine=EngineConfig(model=DIR) (a local model fulgor serves and trains) or "
            "upstream='http://host:port/v1' (a server it only calls), not both or neither"
        )
    if upstream is None:
        if api_key is not None or model is not None:
            raise ConfigError(
                "api_key and model go with upstream=...; the local engine serves the model in its "
                "EngineConfig under EngineConfig.served_model_name"
            )
        return None
    from fulgor.gateway import Upstream

    if isinstance(upstream, str):
        return Upstream(upstream, api_key=api_key)
    if api_key is not None:
        return replace(upstream, api_key=api_key)
    return upstream
