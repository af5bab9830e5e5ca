"""The services a training run needs, started together and stopped together.

``start_services`` starts the run's :class:`~fulgor.engine.base.Engine` (fulgor's engine on a
thread of its own, vLLM under its supervisor, or an OpenAI-compatible server it only calls: see
:func:`~fulgor.training.engines.engine_for`), serves the store API and the gateway from one app on
the caller's event loop (so the trainer can pause, drain and flush the gateway and use the store
directly), and starts the runners. A fresh operator key guards the session: the runners get it,
their agents only the credentials of their own attempts. Leaving the block stops runners, then the
server (the gateway writes what it still holds), then the engine, then closes the store when the
session owns it: no process or port is left, whatever happened inside. A store the caller owns
stays open, for it to use again. ``open_run_store`` opens the run directory's SQLite store for a
new session.

What it does not know: which algorithm runs or what a training step is, or which kind of engine
serves the model (the protocol says what it may ask of one).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fulgor.agent.base import Runnable
from fulgor.credentials import new_operator_key
from fulgor.errors import ConfigError
from fulgor.runner.worker import RunnerConfig
from fulgor.store.base import Store
from fulgor.training.runners import KubernetesRunners, RayRunners, RunnerGroup, runners_url, start_runners

if TYPE_CHECKING:
    from fulgor.engine.base import Engine
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.vllm import VLLMConfig
    from fulgor.gateway import Gateway, Upstream

__all__ = ["Services", "open_run_store", "start_services", "trainer_upstream"]

logger = logging.getLogger(__name__)

_DRAIN_TIMEOUT_SECONDS = 60.0


@dataclass
class Services:
    """What a running session holds: the store, the engine, the gateway, the server's URL and the
    runners."""

    store: Store
    engine: Engine
    gateway: Gateway
    server_url: str
    runners: RunnerGroup

    @property
    def engine_url(self) -> str:
        """The base URL of the engine's OpenAI API, which the gateway calls."""
        return self.engine.url

    @property
    def model_name(self) -> str:
        """The name the model is served under now (on vLLM, a LoRA adapter's changes with each
        version)."""
        return self.engine.model_name

    @property
    def model_version(self) -> int | None:
        """The version of the weights the engine serves; None for an upstream's."""
        return self.engine.model_version

    @property
    def agent_models(self) -> dict[str, str]:
        """The model name each adapter is served under, by adapter name (``LLM.agent_models``)."""
        return self.engine.agent_models

    async def settle_calls(self, rollout_ids: Sequence[str] | None = None) -> None:
        """Wait until no model call is in flight and every recorded call is in the store; with
        ``rollout_ids``, only the calls of those rollouts (other rollouts' calls go on)."""
        if not await self.gateway.settle(rollout_ids, _DRAIN_TIMEOUT_SECONDS):
            logger.warning("model calls still in flight after %.0fs", _DRAIN_TIMEOUT_SECONDS)

    async def swap_weights(self, checkpoint: str, *, pause: bool = True) -> int:
        """Pause the gateway, let calls in flight finish, publish ``checkpoint`` to the engine, resume.

        Returns the engine's new model version; calls made after this return are served by it and
        recorded with it. Without ``pause`` calls keep arriving (rollouts run while the policy
        trains), where the engine publishes between calls: it lets the calls it is running finish
        on the old weights and holds new ones until the new weights serve, and each call records
        the version its engine response names. An engine that cannot do that (vLLM names no
        version in its responses and would serve a call running across the reload with both) is
        always published to paused (new calls get 429 and Retry-After for as long as it takes).
        """
        if not pause and self.engine.publishes_between_calls:
            version = await self.engine.publish(Path(checkpoint))
            self.gateway.model_version = version
            return version
        self.gateway.pause()
        try:
            await self.settle_calls()
            version = await self.engine.publish(Path(checkpoint))
        finally:
            self.gateway.resume(model_version=self.model_version)
        return version


@contextlib.asynccontextmanager
async def start_services(
    store: Store,
    engine: Engine,
    agent: Runnable,
    n_runners: int,
    runner_config: RunnerConfig,
    runner_log: Path,
    *,
    owns_store: bool,
    runners_backend: RayRunners | KubernetesRunners | None = None,
    runner_python: str | None = None,
) -> AsyncIterator[Services]:
    """Start engine, server + gateway and runners; stop them all on leaving, in reverse order.

    With ``owns_store`` the store is closed last; without, it is left open for its owner. The
    engine is started first and stopped last (a server fulgor does not own is only called).
    ``runners_backend`` runs the runners as Ray actors instead of local processes, or each attempt as
    a Kubernetes Job (the server then listens where its ``listen_host`` and ``listen_port`` say, and
    they reach it at its ``server_url``). ``runner_python`` runs the runner processes on that Python
    instead of this one.
    """
    from fulgor.gateway import GatewayConfig, Upstream, create_gateway_app
    from fulgor.net.asgi import serve_asgi
    from fulgor.server import ServerConfig, create_app

    async with contextlib.AsyncExitStack() as stack:
        if owns_store:  # closed last, after the server that serves it
            stack.push_async_callback(store.close)
        stack.push_async_callback(engine.stop)  # also after a start that failed half-way
        await engine.start()
        upstream = Upstream(
            engine.url,
            api_key=engine.api_key,
            request_token_ids=engine.request_token_ids,
            history_format=engine.history_format,
        )
        # One operator key per session: the runners use it, each agent gets its attempt's credential.
        key = new_operator_key()
        gateway_config = GatewayConfig(api_key=key, model_version=engine.model_version)
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
        logger.info("model served at %s, store and gateway at %s", upstream.url, server_url)
        yield Services(store, engine, gateway, server_url, runners)


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
