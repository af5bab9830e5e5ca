"""The trainer's runners: a process pool when child processes can import the agent, else in-process;
or Ray actors (``Trainer(runners=RayRunners(...))``); or one Kubernetes Job per rollout attempt
(``Trainer(runners=KubernetesRunners(...))``).

A ``@fulgor.rollout`` function defined at module level is importable by its ``module:qualname``, so
``n_runners`` processes run it (a :class:`~fulgor.runner.pool.RunnerPool`).
Anything else (an ``Agent`` instance with state, a function defined in ``__main__`` or inside
another function) runs in ``n_runners`` :class:`~fulgor.runner.Runner` loops on the trainer's own
event loop. With :class:`RayRunners`, ``n_runners`` actors of a
:class:`~fulgor.runner.ray_pool.RayRunnerPool` run it, on a Ray instance the session starts or a
cluster it joins.

With :class:`KubernetesRunners`, a :class:`~fulgor.runner.kubernetes_jobs.JobDispatcher` on the
trainer's event loop runs each attempt of a :class:`~fulgor.runner.SubprocessAgent` as a Job.

Every kind stops cleanly: running rollouts get the grace period, then are cancelled and their
attempts marked failed; no process or actor is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fulgor.agent.base import RolloutFunction, Runnable
from fulgor.errors import ConfigError, FulgorError
from fulgor.runner.pool import PoolConfig, load_agent
from fulgor.runner.subprocess_agent import SubprocessAgent
from fulgor.runner.worker import Runner, RunnerConfig, default_worker_id
from fulgor.store.base import Store
from fulgor.store.client import TOKEN_ENV

__all__ = [
    "InProcessRunners",
    "KubernetesRunners",
    "ProcessRunners",
    "RayRunnerGroup",
    "RayRunners",
    "RunnerGroup",
    "agent_spec",
    "check_runner_python",
    "check_runners",
    "runner_path",
    "runners_url",
    "start_runners",
]

logger = logging.getLogger(__name__)


class RunnerGroup(Protocol):
    """Runners the trainer started; ``check`` raises when they can no longer run rollouts."""

    description: str

    def check(self) -> None: ...

    async def stop(self) -> None: ...


def agent_spec(agent: Runnable) -> str | None:
    """``module:qualname`` when another process importing it gets this very agent; else None."""
    if not isinstance(agent, RolloutFunction):
        return None
    module, qualname = agent.func.__module__, agent.func.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return None
    spec = f"{module}:{qualname}"
    try:
        loaded = load_agent(spec)
    except ConfigError:
        return None
    return spec if loaded is agent else None


@dataclass(frozen=True)
class RayRunners:
    """Run the trainer's ``n_runners`` runners as Ray actors (``pip install 'fulgor[ray]'``).

    ``address`` None starts a Ray instance on this machine for the session and shuts it down when
    the session ends (``num_cpus`` caps it; the actors take no CPU of Ray's accounting, so a
    rollout's agent is not queued behind another's); it stays on loopback and sends Ray no usage
    report unless the user turned Ray's usage stats on (:func:`~fulgor.runner.ray_pool.init_local_ray`).
    An address (``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``) joins a running cluster for the
    session and leaves it running. A Ray instance the process had already started (``ray.init``
    before the trainer) is used as it is.
    ``runtime_env`` goes to ``ray.init``; its ``env_vars`` gain a ``PYTHONPATH`` of the trainer's
    ``sys.path``, so that the actors import the agent as the trainer did. An agent that another
    process cannot import by name (an instance with state) is sent to the actors pickled.

    The actors reach the trainer's store server and gateway at ``server_url``; the session serves
    them on ``listen_host:listen_port``. The default, this machine's loopback on a free port, serves
    actors on this machine only; for a cluster of several machines, listen on an address the nodes
    reach and give ``server_url`` (the session's operator key guards it, as for Kubernetes Jobs).
    ``server_url`` None means the address it listens on, which then cannot be a wildcard.
    """

    address: str | None = None
    num_cpus: int | None = None
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    server_url: str | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 0

    def __post_init__(self) -> None:
        _check_reach(self.listen_host, self.server_url, "the Ray actors")

    def start(
        self, agent: Runnable | str, store_url: str, n_runners: int, config: RunnerConfig
    ) -> RayRunnerGroup:
        """Start ``n_runners`` actors of ``agent`` (a ``module:qualname`` or the agent itself)."""
        return RayRunnerGroup(self, agent, store_url, PoolConfig(n_runners=n_runners, runner=config))


@dataclass(frozen=True)
class KubernetesRunners:
    """Run each rollout attempt as a Kubernetes Job (``pip install 'fulgor[kubernetes]'``).

    ``template`` is the text of a Jinja template that renders a ``batch/v1`` Job in YAML (it may
    use ``{{ run }}``, ``{{ namespace }}``, ``{{ job_name }}``, ``{{ rollout_id }}`` and
    ``{{ attempt_id }}``); every field of it is kept but those fulgor sets: the Job's name and
    namespace, the labels and annotations ``fulgor.dev/run``, ``fulgor.dev/rollout-id`` and
    ``fulgor.dev/attempt-id``, ``backoffLimit: 0``, ``restartPolicy: Never``,
    ``activeDeadlineSeconds`` (the rollout's ``timeout_seconds``, rounded up) and the zero-code
    environment in the container named ``container`` (else the first). The agent must be a
    :class:`~fulgor.runner.SubprocessAgent`: its command runs in that container unless the
    template gives one, with its ``env``. ``run`` names this run's Jobs and labels them: Jobs of
    the run whose attempts are not live in the store are deleted, so each run that shares a
    namespace needs its own.

    The pods reach the trainer's store server and gateway at ``server_url``; the session serves
    them on ``listen_host:listen_port`` (its operator key guards them: pods get only their
    attempts' credentials). ``server_url`` None means the address it listens on, which must then be
    one the pods reach (never a wildcard such as ``0.0.0.0``). At most ``max_jobs`` Jobs exist at
    once (None: the trainer's ``n_runners`` x ``max_concurrency``), created at most
    ``max_jobs_per_second``; the run's Jobs are listed every ``poll_seconds``. The client is
    configured from the pod's service account in a cluster, else from ``kubeconfig`` (None:
    ``$KUBECONFIG`` or ``~/.kube/config``) and its ``context``.
    """

    template: str
    run: str
    namespace: str = "default"
    server_url: str | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    max_jobs: int | None = None
    max_jobs_per_second: float = 5.0
    poll_seconds: float = 2.0
    kubeconfig: str | None = None
    context: str | None = None
    container: str | None = None

    def __post_init__(self) -> None:
        from fulgor.runner.job_template import check_run_name

        check_run_name(self.run)
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError(f"max_jobs must be >= 1 (or None), got {self.max_jobs}")
        if self.max_jobs_per_second <= 0 or self.poll_seconds <= 0:
            raise ConfigError("max_jobs_per_second and poll_seconds must be > 0")
        _check_reach(self.listen_host, self.server_url, "the Jobs' pods", "http://trainer.NAMESPACE.svc:8474")

    async def start(
        self, agent: Runnable, store: Store, server_url: str, n_runners: int, config: RunnerConfig
    ) -> KubernetesRunnerGroup:
        """Reconcile the run's Jobs and start dispatching ``agent``'s attempts as Jobs; the pods
        reach the session at ``server_url`` (:func:`runners_url`)."""
        from fulgor.runner.kubernetes_jobs import JobDispatcher, JobSettings, load_batch_api

        if not isinstance(agent, SubprocessAgent):
            raise ConfigError(
                "Kubernetes Jobs run a program: pass a fulgor.SubprocessAgent([...]) (its command runs in "
                f"the Job's container unless the template gives one), got {type(agent).__name__}"
            )
        if agent.reward_fn is not None:
            raise ConfigError(
                "a SubprocessAgent's reward_fn runs beside its program, and a Job's program runs alone: "
                "post the reward from the program to $FULGOR_REWARD_URL instead"
            )
        if config.operator_key is None:
            raise ConfigError("Kubernetes runners need the session's operator key to hand out credentials")
        settings = JobSettings(
            template=self.template,
            run=self.run,
            namespace=self.namespace,
            server_url=server_url,
            operator_key=config.operator_key,
            command=tuple(agent.command),
            env=dict(agent.env),
            working_dir=agent.cwd,
            container=self.container,
            max_jobs=self.max_jobs or n_runners * config.max_concurrency,
            max_jobs_per_second=self.max_jobs_per_second,
            poll_seconds=self.poll_seconds,
            claim_wait_seconds=config.claim_wait_seconds,
        )
        api = await asyncio.to_thread(load_batch_api, self.kubeconfig, self.context)
        dispatcher = JobDispatcher(settings, store, api)
        try:
            await dispatcher.start()
        except BaseException:
            dispatcher.close()
            raise
        return KubernetesRunnerGroup(dispatcher, agent.name)


def _check_reach(
    listen_host: str, server_url: str | None, who: str, example: str = "http://HOST:PORT"
) -> None:
    """ConfigError when the session would listen on a wildcard address with no ``server_url`` to
    give ``who``: a wildcard is where it listens, not an address anyone reaches it at."""
    if server_url is None and listen_host in ("0.0.0.0", "::", ""):
        raise ConfigError(
            f"listening on {listen_host!r}, the session needs server_url: the URL {who} reach this "
            f"machine at (e.g. {example})"
        )


def runners_url(backend: RayRunners | KubernetesRunners | None, server_url: str) -> str:
    """Where the runners reach the session's store server and gateway: the backend's ``server_url``,
    else ``server_url`` (where the session listens)."""
    return (backend.server_url if backend is not None else None) or server_url


class KubernetesRunnerGroup:
    """The Job dispatcher a session started, as a :class:`RunnerGroup`."""

    def __init__(self, dispatcher: Any, agent_name: str) -> None:
        settings = dispatcher.settings
        self.description = (
            f"Kubernetes Jobs (up to {settings.max_jobs} at once) for agent {agent_name!r} in namespace "
            f"{settings.namespace}, run {settings.run}, reaching the trainer at {settings.server_url}"
        )
        self._dispatcher = dispatcher

    def check(self) -> None:
        self._dispatcher.check()

    async def stop(self) -> None:
        await self._dispatcher.stop()


def start_runners(
    agent: Runnable,
    store: Store,
    store_url: str,
    n_runners: int,
    config: RunnerConfig,
    log_path: Path,
    backend: RayRunners | None = None,
    python: str | None = None,
) -> RunnerGroup:
    """Start ``n_runners`` runners for ``agent``: processes when they can import it, else in-process;
    Ray actors with a ``backend``; processes of another ``python`` (an agent's own virtual
    environment) when it is given.

    Runner processes write their log to ``log_path``; in-process runners log like the trainer, and
    Ray actors to Ray's own logs.
    """
    spec = agent_spec(agent)
    group: RunnerGroup
    if python is not None and (backend is not None or spec is None):
        raise ConfigError(
            f"runner_python {python} runs the runners as processes of that Python, which import the "
            "agent by name: give a @fulgor.rollout function or Agent defined at module level "
            f"(got {agent!r}), and no Ray runners"
        )
    if backend is not None:
        group = backend.start(agent if spec is None else spec, store_url, n_runners, config)
    elif spec is None:
        group = InProcessRunners(agent, store, n_runners, config)
    else:
        pool = PoolConfig(n_runners=n_runners, runner=config)
        group = ProcessRunners(spec, store_url, pool, log_path, python=python)
    logger.info("started %s", group.description)
    return group


class InProcessRunners:
    """``n_runners`` runner loops on the caller's event loop, sharing its store object."""

    def __init__(self, agent: Runnable, store: Store, n_runners: int, config: RunnerConfig) -> None:
        self.description = f"{n_runners} in-process runner(s) for agent {agent.name!r}"
        base = default_worker_id()
        self._runners = [
            Runner(agent, store, worker_id=f"{base}-trainer-{i}", config=config) for i in range(n_runners)
        ]
        self._tasks = [
            asyncio.create_task(runner.run(), name=f"fulgor-runner-{i}")
            for i, runner in enumerate(self._runners)
        ]

    def check(self) -> None:
        for task in self._tasks:
            if task.done():
                error = None if task.cancelled() else task.exception()
                raise FulgorError(f"an in-process runner stopped unexpectedly: {error!r}")

    async def stop(self) -> None:
        for runner in self._runners:
            runner.stop()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                logger.error("an in-process runner ended with %r", result)


class ProcessRunners:
    """A :class:`RunnerPool` of ``n_runners`` processes, started as a command of its own.

    A command rather than a forked or spawned child of the trainer: spawning would re-run the
    user's script (``__main__``) in every child, which breaks scripts without a main guard. The
    command sees the trainer's ``sys.path``, so it imports the agent the way the trainer did.

    The pool runs in a session of its own, so that only the trainer drives its shutdown: a Ctrl+C
    in the terminal reaches the trainer alone, whose :meth:`stop` then gives running rollouts
    their grace period (sent to the whole process group, the SIGINT would count as the pool's
    first signal and the trainer's SIGTERM as its second: stop at once). Should the trainer die,
    the pool reads end-of-file on its pipe and drains.

    ``python`` runs the pool on another interpreter (an agent's own virtual environment, whose
    packages clash with the trainer's): it sees the trainer's ``sys.path`` but for the trainer's
    own standard library and site-packages, so it imports from source what the trainer does (the
    agent's modules, a fulgor checkout) and everything else from its own environment. It is asked
    first (:func:`check_runner_python`) whether it loads the agent with the trainer's fulgor.
    """

    def __init__(
        self, spec: str, store_url: str, config: PoolConfig, log_path: Path, python: str | None = None
    ) -> None:
        on = "" if python is None else f" on {python}"
        self.description = (
            f"{config.n_runners} runner process(es) for agent {spec}{on}, logging to {log_path}"
        )
        self._log_path = log_path
        self._config = config
        # Imported here: the command imports this package, and runpy warns when it finds the
        # module it runs already imported.
        from fulgor.training._pool import command_line

        env = {**os.environ, "PYTHONPATH": runner_path(foreign=python is not None)}
        if python is not None:
            check_runner_python(python, spec, env)
        if config.runner.operator_key is not None:  # not on the command line: see command_line
            env[TOKEN_ENV] = config.runner.operator_key
        log_path.parent.mkdir(parents=True, exist_ok=True)  # before the pipe: a failure leaks no descriptor
        # Only this process holds the write end (os.pipe's descriptors are not inherited): the pool
        # sees end-of-file when the trainer is gone.
        parent_read, self._parent_write = os.pipe()
        command = command_line(spec, store_url, config, parent_read, python or sys.executable)
        try:
            with log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    command,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(parent_read,),
                    start_new_session=True,
                )
        except BaseException:
            os.close(self._parent_write)
            raise
        finally:
            os.close(parent_read)

    def check(self) -> None:
        code = self._process.poll()
        if code is not None:
            raise FulgorError(f"the runner processes exited (code {code}); see {self._log_path} for why")

    async def stop(self) -> None:
        """Drain (SIGTERM), then stop now (a second SIGTERM), then kill: each after a bounded wait.

        Cancelled while it waits (a second Ctrl+C), it tells the pool to stop now at once and kills
        it if it has not within ``kill_after_seconds``, blocking meanwhile (a cancelled stop can
        await nothing more).
        """
        drain_seconds = self._config.runner.shutdown_grace_seconds + 5.0
        stop_now_seconds = self._config.kill_after_seconds + 5.0
        signals = 0
        try:
            for wait_seconds in (drain_seconds, stop_now_seconds):
                if self._process.poll() is not None:
                    break
                self._process.send_signal(signal.SIGTERM)
                signals += 1
                # The runners report their last attempts to the store on this event loop: never block it.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(self._process.wait, wait_seconds)
        finally:
            if self._process.poll() is None and signals < 2:
                # Stop now: the runners end their agents' process groups, which are sessions of
                # their own that killing the pool would not reach.
                self._process.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(stop_now_seconds)
            if self._process.poll() is None:
                logger.error("the runner pool did not stop; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
            os.close(self._parent_write)


def check_runners(backend: object, python: str | Path | None) -> str | None:
    """``Trainer(runners=..., runner_python=...)`` checked: the runners one of fulgor's kinds, and
    ``runner_python`` (returned as a string) the path of an executable file, for local runners."""
    if backend is not None and not isinstance(backend, RayRunners | KubernetesRunners):
        raise ConfigError(
            "runners must be None (local processes), fulgor.RayRunners(...) or "
            f"fulgor.KubernetesRunners(...), got {backend!r}"
        )
    if python is None:
        return None
    if backend is not None:
        raise ConfigError(
            f"runner_python starts local runner processes: it cannot go with {type(backend).__name__}"
        )
    path = Path(python)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(
            f"runner_python {str(python)!r} is not an executable file: give the Python of the agent's "
            "environment, e.g. .venv-agent/bin/python"
        )
    return str(path)


def runner_path(foreign: bool) -> str:
    """The trainer's ``sys.path`` as the runners' ``PYTHONPATH``; for another Python (``foreign``),
    without what lies under the trainer's own prefixes (its standard library and site-packages),
    which that Python has its own of."""
    entries = [entry or os.getcwd() for entry in sys.path]
    if foreign:
        prefixes = {
            os.path.realpath(prefix)
            for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
        }
        entries = [
            entry
            for entry in entries
            if not any(Path(os.path.realpath(entry)).is_relative_to(prefix) for prefix in prefixes)
        ]
    return os.pathsep.join(entries)


def check_runner_python(python: str, spec: str, env: Mapping[str, str]) -> None:
    """Raise ConfigError, saying what to do, unless ``python`` loads the agent ``spec`` with the
    same fulgor version as the trainer's (``python -m fulgor.training._pool --check SPEC``)."""
    from fulgor.training._pool import CHECK
    from fulgor.version import __version__

    command = [python, "-m", "fulgor.training._pool", CHECK, spec]
    try:
        done = subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ConfigError(f"cannot run the runner Python {python}: {error}") from error
    said = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
    if done.returncode == 2:
        raise ConfigError(f"the runner Python {python} cannot load the agent: {said}")
    install = (
        f"install fulgor {__version__} in its environment ({python} -m pip install fulgor=={__version__}, "
        "or `-m pip install -e .` from a fulgor checkout)"
    )
    if done.returncode != 0:
        raise ConfigError(f"the runner Python {python} cannot run fulgor's runners ({said}): {install}")
    version = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "none"
    if version != __version__:
        raise ConfigError(
            f"the runner Python {python} has fulgor {version}, the trainer {__version__}: {install}"
        )


class RayRunnerGroup:
    """A :class:`~fulgor.runner.ray_pool.RayRunnerPool` the trainer started and stops."""

    def __init__(
        self, backend: RayRunners, agent: Runnable | str, store_url: str, config: PoolConfig
    ) -> None:
        from fulgor.runner.ray_pool import RayRunnerPool, init_local_ray, require_ray

        self._owns_ray = False
        # Ray is imported only once it is known whether to start it: a local instance stays on
        # loopback only when its switch is set before the import (init_local_ray).
        ray_module = sys.modules.get("ray")
        if ray_module is None or not ray_module.is_initialized():
            path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
            runtime_env = dict(backend.runtime_env)
            runtime_env["env_vars"] = {"PYTHONPATH": path, **dict(runtime_env.get("env_vars") or {})}
            if backend.address is None:
                # A new instance even where a cluster of this machine runs (ray.init alone would
                # join that cluster, or fail on one that ended without its address file).
                init_local_ray(backend.num_cpus, runtime_env)
            else:
                require_ray().init(
                    address=backend.address,
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env=runtime_env,
                )
            # Shut down when the session ends: a local instance stops, a cluster joined by address
            # is only left (this process's driver disconnects; the cluster runs on).
            self._owns_ray = True
        self._ray = require_ray()
        where = "a local Ray instance" if backend.address is None else f"the Ray cluster at {backend.address}"
        name = agent if isinstance(agent, str) else repr(agent.name)
        self.description = f"{config.n_runners} Ray runner actor(s) for agent {name} on {where}"
        self._pool = RayRunnerPool(agent, store_url, config)
        try:
            self._pool.start()
        except BaseException:
            self._shutdown()
            raise

    def check(self) -> None:
        """Raise once every actor has stopped: an actor that dies alone leaves its rollouts to the
        others (its attempts go unresponsive and are retried as their config says)."""
        if self._pool.actors_running() == 0:
            raise FulgorError(
                "every Ray runner actor stopped; Ray's logs (/tmp/ray/session_latest/logs) say why"
            )

    async def stop(self) -> None:
        try:
            await asyncio.to_thread(self._pool.stop)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False
