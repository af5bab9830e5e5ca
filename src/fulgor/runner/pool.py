"""A pool of runner processes on one machine, with a shutdown that leaves nothing behind.

``n_runners`` child processes each run one :class:`~fulgor.runner.worker.Runner` against the store
at ``store_url`` (a SQLite file several processes may share, or a ``fulgor serve`` URL).

Signals: the children ignore SIGINT and take their orders from the parent as SIGUSR1 (drain) and
SIGUSR2 (stop now), so one Ctrl+C is one decision even when the whole process group receives it;
a SIGTERM sent to a child directly makes it drain.
The first SIGINT or SIGTERM to the parent makes every child stop claiming and drain (running
rollouts get ``shutdown_grace_seconds``, then are cancelled and their attempts marked failed, so
the store requeues or fails them); the second makes children cancel at once; children still alive
``kill_after_seconds`` after that are killed (:meth:`RunnerPool.stop_now` does what a second
signal does, from any thread). A child whose parent died stops at once by itself.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import FrameType

from fulgor.agent.base import Runnable
from fulgor.errors import ConfigError, FulgorError
from fulgor.runner.worker import Runner, RunnerConfig, default_worker_id

__all__ = ["PoolConfig", "RunnerPool", "check_shared_store", "check_store_url", "load_agent"]

logger = logging.getLogger(__name__)


def load_agent(spec: str) -> Runnable:
    """Import ``module:object`` and return it as a runnable agent (an instance, or a class to build).

    Modules in the current directory are importable, as with ``python -m``: the installed
    ``fulgor`` script has its own folder on ``sys.path`` instead, so the current directory is
    added (after everything else, so that it cannot shadow an installed package). Spawned runner
    processes inherit the parent's ``sys.path``.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"agent {spec!r} must be written module:object, e.g. examples.calc.agent:solve")
    _add_current_directory_to_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"cannot import {module_name!r} for agent {spec!r}: {error}") from error
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{module_name!r} has no attribute {attribute!r} (agent {spec!r})")
        target = getattr(target, part)
    agent = target() if isinstance(target, type) else target
    if not isinstance(agent, Runnable):
        raise ConfigError(
            f"{spec!r} is not an agent: decorate a function with @fulgor.rollout or subclass Agent"
        )
    return agent


def _add_current_directory_to_path() -> None:
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def check_shared_store(store_url: str) -> None:
    """Refuse a store the pool's runners cannot share: each would open its own and see nothing."""
    if store_url.startswith("memory://"):
        raise ConfigError(
            f"store {store_url!r} cannot be shared by runner processes: each would open its own empty "
            "in-memory store and run nothing. Use a store every process can open: a SQLite file "
            "(sqlite:///runs/NAME/store.sqlite) or the URL `fulgor serve` prints (http://HOST:PORT)"
        )


@dataclass(frozen=True)
class PoolConfig:
    """How many runner processes, and how each one runs."""

    n_runners: int = 1
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    kill_after_seconds: float = 3.0
    torch_threads: int = 1
    """Threads each child may use for torch/BLAS: children competing for all cores slow each other."""

    def __post_init__(self) -> None:
        if self.n_runners < 1:
            raise ConfigError(f"n_runners must be >= 1, got {self.n_runners}")


def check_store_url(store_url: str) -> None:
    """Open and close the store at ``store_url`` once: a bad URL is one ConfigError here, not a
    traceback from every runner process. Whether a server is up is not checked: runners retry."""
    from fulgor.store.sync import open_store

    try:
        store = open_store(store_url)
    except FulgorError:
        raise
    except Exception as error:  # the pool's boundary: whatever the backend raised, said plainly
        shown = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", store_url)  # never a password
        raise ConfigError(f"cannot open the store {shown!r}: {error}") from error
    asyncio.run(store.close())  # the pool is driven from a main thread without an event loop


class RunnerPool:
    """Starts, supervises and stops ``n_runners`` runner processes."""

    def __init__(self, agent_spec: str, store_url: str, config: PoolConfig | None = None) -> None:
        check_shared_store(store_url)
        # Fail here, in the parent, with one clear message rather than in every child.
        load_agent(agent_spec)
        check_store_url(store_url)
        self.agent_spec = agent_spec
        self.store_url = store_url
        self.config = config or PoolConfig()
        self._children: list[BaseProcess] = []
        self._signals = 0

    def run(self) -> int:
        """Run until every child has exited (after a signal, or on its own); returns an exit code."""
        context = multiprocessing.get_context("spawn")
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        # Children watch the read end: it reaches end-of-file when this process dies, however it dies.
        parent_alive, keep_open = context.Pipe(duplex=False)
        try:
            for index in range(self.config.n_runners):
                worker_id = f"{default_worker_id()}-{index}"
                child = context.Process(
                    target=_child_main,
                    args=(self.agent_spec, self.store_url, self.config, worker_id, parent_alive),
                    name=f"fulgor-runner-{index}",
                )
                child.start()
                self._children.append(child)
            parent_alive.close()
            return self._supervise()
        finally:
            keep_open.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop_now(self) -> None:
        """What a second signal does, from any thread: every child cancels its rollouts at once, and
        is killed if it has not exited ``kill_after_seconds`` later."""
        self._signals = max(self._signals, 2)
        self._order(_STOP_NOW)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self._order(_DRAIN if self._signals == 1 else _STOP_NOW)

    def _order(self, order: signal.Signals) -> None:
        for child in self._children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, order)

    def _supervise(self) -> int:
        second_signal_time: float | None = None
        while any(child.is_alive() for child in self._children):
            if self._signals >= 2 and second_signal_time is None:
                second_signal_time = time.monotonic()
            if (
                second_signal_time is not None
                and time.monotonic() - second_signal_time > self.config.kill_after_seconds
            ):
                for child in self._children:
                    if child.is_alive():
                        child.kill()
            for child in self._children:
                child.join(timeout=0.1)
        failed = [child.name for child in self._children if child.exitcode != 0]
        if failed and self._signals == 0:
            logger.error("runner processes exited with an error: %s", ", ".join(failed))
            return 1
        return 0


# The parent's orders to its children: distinct signals, so that a SIGTERM sent to the whole process
# group (by `timeout`, a service manager, or `kill -TERM -PGID`) still counts as one decision.
_DRAIN = signal.SIGUSR1
_STOP_NOW = signal.SIGUSR2


def _child_main(
    agent_spec: str, store_url: str, config: PoolConfig, worker_id: str, parent_alive: Connection
) -> None:
    """Entry point of one runner process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("OMP_NUM_THREADS", str(config.torch_threads))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(config.torch_threads)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {worker_id} %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(_run_child(load_agent(agent_spec), store_url, config.runner, worker_id, parent_alive))


async def _run_child(
    agent: Runnable, store_url: str, config: RunnerConfig, worker_id: str, parent_alive: Connection
) -> None:
    from fulgor.store.sync import open_store

    store = open_store(store_url)
    runner = Runner(agent, store, worker_id=worker_id, config=config)
    loop = asyncio.get_running_loop()

    def stop_now() -> None:
        runner.config = replace(runner.config, shutdown_grace_seconds=0)
        runner.stop()
        for task in asyncio.all_tasks(loop):
            if task.get_name().startswith("fulgor-rollout-"):
                task.cancel()

    def on_parent_gone() -> None:
        # Nobody supervises this runner any more, or waits for its rollouts: stop now.
        loop.remove_reader(parent_alive.fileno())
        logger.warning("the runner pool's parent process is gone; stopping now")
        stop_now()

    loop.add_signal_handler(signal.SIGTERM, runner.stop)
    loop.add_signal_handler(_DRAIN, runner.stop)
    loop.add_signal_handler(_STOP_NOW, stop_now)
    loop.add_reader(parent_alive.fileno(), on_parent_gone)
    try:
        await runner.run()
    finally:
        await store.close()
