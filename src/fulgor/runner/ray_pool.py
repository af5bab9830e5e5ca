"""The same runners as Ray actors, for clusters (``pip install 'fulgor[ray]'``).

Each actor runs one :class:`~fulgor.runner.worker.Runner` on its own event loop against the store
at ``store_url``, which every node must reach: a ``fulgor serve`` URL on a cluster, or a SQLite
file when Ray runs on one machine. ``stop`` drains the actors like the first Ctrl+C of the process
pool (running rollouts get their grace period, then are failed so the store requeues them) and
then kills them, so no actor outlives the pool.
"""

from __future__ import annotations

import logging
from typing import Any

from fulgor.agent.base import Runnable
from fulgor.errors import ConfigError
from fulgor.runner.pool import PoolConfig, load_agent
from fulgor.runner.worker import Runner, RunnerConfig

__all__ = ["RayRunnerPool"]

logger = logging.getLogger(__name__)


def _ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ConfigError("runner_backend='ray' needs Ray: pip install 'fulgor[ray]'") from error
    return ray


class _RunnerActor:
    """One runner inside a Ray actor (an async actor: ``run`` and ``stop`` interleave)."""

    def __init__(self, agent: Runnable | str, store_url: str, config: RunnerConfig, worker_id: str) -> None:
        from fulgor.store.sync import open_store

        self._store = open_store(store_url)
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
        if isinstance(agent, str):
            load_agent(agent)  # fail here with a clear message rather than inside an actor
        self.agent = agent
        self.store_url = store_url
        self.config = config or PoolConfig()
        self._actors: list[Any] = []
        self._runs: list[Any] = []

    def start(self) -> None:
        """Start the actors (Ray must be initialised: ``ray.init(...)``) and their claim loops."""
        ray = _ray()
        if not ray.is_initialized():
            raise ConfigError("Ray is not initialised: call ray.init() (or ray.init(address=...)) first")
        actor_class = ray.remote(num_cpus=0)(_RunnerActor)
        for index in range(self.config.n_runners):
            actor = actor_class.options(name=None, max_concurrency=1000).remote(
                self.agent, self.store_url, self.config.runner, f"ray-runner-{index}"
            )
            self._actors.append(actor)
            self._runs.append(actor.run.remote())

    def stop(self, timeout_seconds: float | None = None) -> int:
        """Drain every actor, then kill it; returns how many rollouts the actors completed."""
        ray = _ray()
        ray.get([actor.stop.remote() for actor in self._actors])
        wait = (
            timeout_seconds if timeout_seconds is not None else self.config.runner.shutdown_grace_seconds + 30
        )
        ready, pending = ray.wait(self._runs, num_returns=len(self._runs), timeout=wait)
        completed = sum(ray.get(ready))
        if pending:
            logger.warning("%d runner actors did not drain in %.0fs; killing them", len(pending), wait)
        for actor in self._actors:
            ray.kill(actor)
        self._actors.clear()
        self._runs.clear()
        return int(completed)
