"""The same runners as Ray actors, for clusters (``pip install 'fulgor[ray]'``).

Each actor runs one :class:`~fulgor.runner.worker.Runner` on its own event loop against the store
at ``store_url``, which every node must reach: a ``fulgor serve`` URL on a cluster, or a SQLite
file when Ray runs on one machine. ``stop`` drains the actors like the first Ctrl+C of the process
pool (running rollouts get their grace period, then are failed so the store requeues them) and
then kills them, so no actor outlives the pool.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from fulgor.agent.base import Runnable
from fulgor.errors import ConfigError
from fulgor.runner.pool import PoolConfig, check_shared_store, load_agent
from fulgor.runner.worker import Runner, RunnerConfig

__all__ = ["RayRunnerPool", "require_ray"]

logger = logging.getLogger(__name__)


def require_ray() -> Any:
    """The ``ray`` module; ConfigError naming the extra when it is not installed."""
    try:
        import ray
    except ImportError as error:
        raise ConfigError("runners on Ray need Ray: pip install 'fulgor[ray]'") from error
    return ray


class _RunnerActor:
    """One runner inside a Ray actor (an async actor: ``run`` and ``stop`` interleave)."""

    def __init__(self, agent: Runnable | str, store_url: str, config: RunnerConfig, worker_id: str) -> None:
        from fulgor.store.client import StoreClient
        from fulgor.store.sync import open_store

        # A store served over HTTP takes the runners' operator key, which the actor's environment
        # (unlike a runner process's) does not carry.
        http = store_url.startswith(("http://", "https://"))
        self._store = StoreClient(store_url, token=config.operator_key) if http else open_store(store_url)
        self._runner = Runner(
            load_agent(agent) if isinstance(agent, str) else agent,
            self._store,
            worker_id=worker_id,
            config=config,
        )

    async def run(self) -> int:
        try:
            await self._runner.run()
        finally:
            await self._store.close()
        return self._runner.completed

    async def stop(self) -> None:
        self._runner.stop()


class RayRunnerPool:
    """``n_runners`` runner actors on a Ray cluster (or a local Ray instance)."""

    def __init__(self, agent: Runnable | str, store_url: str, config: PoolConfig | None = None) -> None:
        check_shared_store(store_url)
        if isinstance(agent, str):
            load_agent(agent)  # fail here with a clear message rather than inside an actor
        self.agent = agent
        self.store_url = store_url
        self.config = config or PoolConfig()
        # Unique per pool: two pools on one cluster (or one store) must not share worker ids, or
        # the store could not tell their heartbeats and attempts apart.
        pool_id = secrets.token_hex(4)
        self.worker_ids = [f"ray-{pool_id}-runner-{index}" for index in range(self.config.n_runners)]
        self._actors: list[Any] = []
        self._runs: list[Any] = []

    def start(self) -> None:
        """Start the actors (Ray must be initialised: ``ray.init(...)``) and their claim loops."""
        ray = require_ray()
        if not ray.is_initialized():
            raise ConfigError("Ray is not initialised: call ray.init() (or ray.init(address=...)) first")
        actor_class = ray.remote(num_cpus=0)(_RunnerActor)
        for worker_id in self.worker_ids:
            actor = actor_class.options(name=None, max_concurrency=1000).remote(
                self.agent, self.store_url, self.config.runner, worker_id
            )
            self._actors.append(actor)
            self._runs.append(actor.run.remote())

    def actors_running(self) -> int:
        """How many of the started actors' claim loops have not ended (0 before ``start``)."""
        if not self._runs:
            return 0
        ray = require_ray()
        ended, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
        return len(self._runs) - len(ended)

    def stop(self, timeout_seconds: float | None = None) -> int:
        """Drain every actor, then kill it; returns how many rollouts the actors completed.

        Every actor is killed even when some have died or fail to drain, so that none keeps claiming.
        """
        ray = require_ray()
        try:
            return self._drain(ray, timeout_seconds)
        finally:
            for actor in self._actors:
                ray.kill(actor)
            self._actors.clear()
            self._runs.clear()

    def _drain(self, ray: Any, timeout_seconds: float | None) -> int:
        wait = (
            timeout_seconds if timeout_seconds is not None else self.config.runner.shutdown_grace_seconds + 30
        )
        stops = [actor.stop.remote() for actor in self._actors]
        completed = _results(ray, self._runs, wait)
        _results(ray, stops, 0)  # only to log the actors that had died
        if len(completed) < len(self._runs):
            logger.warning(
                "%d of %d runner actors died or did not drain in %.0fs; killing them",
                len(self._runs) - len(completed),
                len(self._runs),
                wait,
            )
        return int(sum(completed))


def _results(ray: Any, refs: list[Any], timeout_seconds: float) -> list[Any]:
    """The results of the ``refs`` that finish within the timeout; a dead actor's is logged, not raised."""
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_seconds)
    results = []
    for ref in ready:
        try:
            results.append(ray.get(ref))
        except ray.exceptions.RayError as failure:
            logger.warning("a runner actor failed: %s", failure)
    return results
