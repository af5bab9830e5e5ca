"""The same runners as Ray actors, for clusters (``pip install 'fulgor[ray]'``).

Each actor runs one :class:`~fulgor.runner.worker.Runner` on its own event loop against the store
at ``store_url``, which every node must reach: a ``fulgor serve`` URL on a cluster, or a SQLite
file when Ray runs on one machine. ``stop`` drains the actors like the first Ctrl+C of the process
pool (running rollouts get their grace period, then are failed so the store requeues them) and
then kills them, so no actor outlives the pool.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fulgor.agent.base import Runnable
from fulgor.errors import ConfigError
from fulgor.runner.pool import PoolConfig, check_shared_store, load_agent
from fulgor.runner.worker import Runner, RunnerConfig

__all__ = ["RayRunnerPool", "init_local_ray", "require_ray"]

logger = logging.getLogger(__name__)


def require_ray() -> Any:
    """The ``ray`` module; ConfigError naming the extra when it is not installed."""
    try:
        import ray
    except ImportError as error:
        raise ConfigError("runners on Ray need Ray: pip install 'fulgor[ray]'") from error
    return ray


_CLUSTERS_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_USAGE_STATS_SWITCH = "RAY_USAGE_STATS_ENABLED"
_LOCAL_RAY_ENVIRONMENT = {
    # Ray's own switch (meant for Windows and macOS) under which every Ray process takes loopback as
    # its node address; on Linux Ray otherwise takes the address of the default route, connects to
    # itself there and binds on every address. Ray reads it when it is imported.
    _CLUSTERS_SWITCH: "0",
    # No usage report to Ray's servers (unless the user chose: see init_local_ray).
    _USAGE_STATS_SWITCH: "0",
}
"""The environment of a Ray instance fulgor starts on this machine."""


def _usage_stats_chosen() -> bool:
    """Whether the user chose Ray's usage stats, on or off: its environment variable, or the file
    that ``ray enable-usage-stats`` and ``ray disable-usage-stats`` write."""
    if _USAGE_STATS_SWITCH in os.environ:
        return True
    path = os.environ.get("RAY_USAGE_STATS_CONFIG_PATH") or os.path.expanduser("~/.ray/config.json")
    try:
        return json.loads(Path(path).read_text()).get("usage_stats") is not None
    except (OSError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while Ray is imported and starts its processes,
    which inherit it; the environment as it was afterwards."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def init_local_ray(num_cpus: int | None, runtime_env: Mapping[str, Any]) -> None:
    """Start a new Ray instance on this machine for this process (``ray.init("local")``, whatever
    cluster this machine runs) that stays on loopback, and sends no usage report unless the user
    turned Ray's usage stats on (``RAY_USAGE_STATS_ENABLED=1`` or ``ray enable-usage-stats``).

    Every Ray process takes 127.0.0.1 as its node address, and listens and connects there only.
    Ray reads the switch that does it when it is imported: where this process imported Ray before
    without ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the instance takes this machine's network
    address, and a warning says so; where this call imports it, this process's Ray keeps loopback
    as its own address afterwards too (a cluster on other machines is joined from another
    process). Ray's dashboard process still asks the cloud metadata servers which cloud it runs on
    when it starts, usage stats or not (README: "What reaches the network"). Joining a cluster by
    address is ``ray.init(address)`` as Ray has it."""
    environment = dict(_LOCAL_RAY_ENVIRONMENT)
    if _usage_stats_chosen():
        del environment[_USAGE_STATS_SWITCH]
    with _environment(environment):
        ray = require_ray()
        from ray._private import ray_constants

        if ray_constants.ENABLE_RAY_CLUSTER:
            logger.warning(
                "Ray was imported before fulgor started its local Ray instance, without %s=0 in the "
                "environment: the instance takes this machine's network address and listens there. "
                "Set %s=0 before Ray is imported (or let fulgor import it) to keep it on loopback.",
                _CLUSTERS_SWITCH,
                _CLUSTERS_SWITCH,
            )
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env=dict(runtime_env),
        )


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
