"""Rollouts as Kubernetes Jobs: one Job per attempt, created and watched with the official
``kubernetes`` client (``pip install 'fulgor[kubernetes]'``).

:class:`JobDispatcher` claims each rollout from the store on the trainer's event loop and creates
one Job for its attempt, rendered from the user's template (:mod:`fulgor.runner.job_template`).
The Job's pod runs a zero-code program (a :class:`~fulgor.runner.SubprocessAgent`'s command, or
the template's own) with the zero-code environment
(:func:`~fulgor.runner.subprocess_agent.zero_code_environment`): its attempt's gateway URL and
credential (never the operator key), its task, its resources, and a reward URL on the trainer's
server (:mod:`fulgor.server.rewards`).

Creations are spaced by ``1 / max_jobs_per_second`` seconds, counted from the previous creation's
answer. Every ``poll_seconds`` the dispatcher lists the run's Jobs (by the run label; a poll, not
a watch), heartbeats the attempts whose Jobs run, and records each finished Job's outcome:
``Complete`` succeeds its attempt, ``Failed`` fails it with an error naming the Job
(``DeadlineExceeded`` times it out); then the Job is deleted. A Job labelled for this run whose
attempt is no longer live (an earlier session's, a cancelled rollout's, one the watchdog ended) is
deleted too (orphans reconciled), at start and at every poll. Stopping fails the attempts still
running and deletes every Job of the run (``propagationPolicy: Background``, so their pods go too).

What it does not know: the trainer, the gateway, how the pods reach the trainer (the URL it is
given), or what runs in the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fulgor.credentials import attempt_credential
from fulgor.errors import ConfigError, FulgorError, InvalidTransitionError, NotFoundError
from fulgor.runner.job_template import (
    LABEL_ATTEMPT,
    LABEL_ROLLOUT,
    LABEL_RUN,
    check_run_name,
    job_name,
    render_job,
)
from fulgor.runner.subprocess_agent import TASK_ENV_LIMIT_BYTES, zero_code_environment
from fulgor.runner.worker import attempt_resources, default_worker_id
from fulgor.store.base import Store
from fulgor.types import AttemptedRollout, AttemptStatus

__all__ = ["JobDispatcher", "JobSettings", "load_batch_api", "reward_url"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def reward_url(server_url: str, rollout_id: str, attempt_id: str, credential: str) -> str:
    """The attempt's reward URL on the trainer's server (:mod:`fulgor.server.rewards`)."""
    return f"{server_url.rstrip('/')}/v1/rewards/{rollout_id}/{attempt_id}/{credential}"


def load_batch_api(kubeconfig: str | None, context: str | None) -> Any:
    """A ``kubernetes.client.BatchV1Api``: from the pod's service account when in a cluster and no
    ``kubeconfig`` is named, else from ``kubeconfig`` (None: ``$KUBECONFIG`` or ``~/.kube/config``)."""
    import os

    try:
        from kubernetes import client
        from kubernetes import config as kube_config
    except ImportError as missing:
        raise ConfigError(
            "Kubernetes runners need the official client: pip install 'fulgor[kubernetes]'"
        ) from missing
    config: Any = kube_config  # untyped
    configuration = client.Configuration()
    try:
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (config.ConfigException, OSError) as error:
        raise ConfigError(
            f"cannot load the Kubernetes configuration ({kubeconfig or 'default'}): {error}"
        ) from error
    return client.BatchV1Api(client.ApiClient(configuration))


@dataclass(frozen=True)
class JobSettings:
    """What the dispatcher needs beyond the store: see :class:`~fulgor.training.runners.KubernetesRunners`."""

    template: str
    run: str
    namespace: str
    server_url: str
    operator_key: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    working_dir: str | None = None
    container: str | None = None
    max_jobs: int = 1
    max_jobs_per_second: float = 5.0
    poll_seconds: float = 2.0
    claim_wait_seconds: float = 5.0


@dataclass
class _Running:
    claimed: AttemptedRollout
    job_name: str
    created_monotonic: float | None = None


class JobDispatcher:
    """Claims rollouts and runs each attempt as a Job; see the module docstring. ``api`` is a
    ``kubernetes.client.BatchV1Api`` (its blocking calls run on threads)."""

    def __init__(self, settings: JobSettings, store: Store, api: Any) -> None:
        check_run_name(settings.run)
        self.settings = settings
        self.store = store
        self.api = api
        self.worker_id = f"k8s-{settings.run}-{default_worker_id()}"
        self._running: dict[str, _Running] = {}  # by attempt id
        self._slot_freed = asyncio.Event()
        self._next_creation = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Reconcile the run's Jobs left from before (a first failure to reach the API raises), then
        claim and watch in the background."""
        await self._sync()
        self._tasks = [
            asyncio.create_task(self._dispatch_loop(), name="fulgor-k8s-dispatch"),
            asyncio.create_task(self._watch_loop(), name="fulgor-k8s-watch"),
        ]

    def check(self) -> None:
        for task in self._tasks:
            if task.done():
                error = None if task.cancelled() else task.exception()
                raise FulgorError(f"the Kubernetes Job dispatcher stopped unexpectedly: {error!r}")

    async def stop(self) -> None:
        """Stop claiming (a claim in flight still returns, and what it took is failed) and watching,
        fail the attempts still running, delete every Job of the run, close the client."""
        self._stopping.set()
        for task in self._tasks[1:]:  # the watch; the dispatch loop (first) ends by itself
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for running in list(self._running.values()):
            error = f"the trainer stopped before Job {running.job_name} finished"
            await self._report(running, "failed", error)
        try:
            for job in await self._list_jobs():
                await self._delete(job.metadata.name)
        except FulgorError as failure:
            logger.error("could not list the run's Jobs to delete them: %s", failure)
        finally:
            self.close()

    def close(self) -> None:
        """Close the client's connections (``stop`` does; a dispatcher that did not start must)."""
        self.api.api_client.close()

    # -- claiming and creating ----------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while not self._stopping.is_set():
            free = self.settings.max_jobs - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                await self._first(self._slot_freed.wait())
                continue
            claim = self.store.claim(
                self.worker_id, limit=free, wait_seconds=self.settings.claim_wait_seconds
            )
            try:
                # Stopping mid-claim: the claim still finishes, so that nothing it took is left unreported.
                claimed_now = await self._first(claim, keep=True) or []
            except FulgorError as failure:
                logger.warning(
                    "claim failed (%s); retrying in %.1fs", failure, self.settings.claim_wait_seconds
                )
                await self._first(asyncio.sleep(self.settings.claim_wait_seconds))
                continue
            for claimed in claimed_now:
                running = _Running(claimed, job_name(self.settings.run, claimed.attempt.attempt_id))
                self._running[claimed.attempt.attempt_id] = running  # stop() fails it if not created
                if not self._stopping.is_set():
                    await self._wait_for_rate()
                    await self._create(running)

    async def _first(self, work: Coroutine[Any, Any, _T], *, keep: bool = False) -> _T | None:
        """``work``'s result, or None once stopping (``work`` cancelled, or awaited still with ``keep``)."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done() and not keep:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return await task

    async def _wait_for_rate(self) -> None:
        """Sleep until ``1 / max_jobs_per_second`` after the previous creation's answer: counted
        from the answer, the API server sees the creations at least that far apart."""
        delay = self._next_creation - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _create(self, running: _Running) -> None:
        claimed, settings = running.claimed, self.settings
        rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
        try:
            env = await self._environment(claimed)
            job = render_job(
                settings.template,
                run=settings.run,
                namespace=settings.namespace,
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                timeout_seconds=claimed.config.timeout_seconds,
                env=env,
                command=settings.command,
                working_dir=settings.working_dir,
                container=settings.container,
            )
            try:
                create = self.api.create_namespaced_job
                await self._call("create", running.job_name, create, settings.namespace, job)
            finally:
                self._next_creation = time.monotonic() + 1.0 / settings.max_jobs_per_second
            # Once the API has answered: a list sent later than this must show the Job.
            running.created_monotonic = time.monotonic()
        except FulgorError as failure:
            logger.error("rollout %s: %s", rollout_id, failure)
            await self._report(running, "failed", f"{type(failure).__name__}: {failure}")
            return
        with contextlib.suppress(InvalidTransitionError, NotFoundError):  # the store may have ended it
            await self.store.update_attempt(rollout_id, attempt_id, status="running")
        logger.info("rollout %s attempt %s runs as Job %s", rollout_id, attempt_id, running.job_name)

    async def _environment(self, claimed: AttemptedRollout) -> dict[str, str]:
        settings = self.settings
        rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
        resources = await attempt_resources(self.store, claimed, settings.server_url, settings.operator_key)
        task_json = json.dumps(claimed.input)
        if len(task_json.encode()) > TASK_ENV_LIMIT_BYTES:
            raise ConfigError(
                f"the task is {len(task_json.encode())} bytes as JSON: a Job passes it in FULGOR_TASK, which "
                f"holds at most {TASK_ENV_LIMIT_BYTES}; pass a reference (a path or key) in the task instead"
            )
        credential = attempt_credential(settings.operator_key, rollout_id, attempt_id)
        url = reward_url(settings.server_url, rollout_id, attempt_id, credential)
        return {
            **(settings.env or {}),
            **zero_code_environment(resources, rollout_id, attempt_id, url, task_json),
        }

    # -- watching, reconciling -----------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_seconds)
            try:
                await self._sync()
            except FulgorError as failure:
                logger.warning(
                    "could not read the run's Jobs (%s); trying again in %.1fs",
                    failure,
                    self.settings.poll_seconds,
                )

    async def _sync(self) -> None:
        """Heartbeat the running attempts, record finished Jobs, delete orphans, fail vanished Jobs."""
        listed_at = time.monotonic()
        jobs = await self._list_jobs()
        if self._running:
            await self.store.heartbeat(
                self.worker_id, {"active": len(self._running)}, attempt_ids=list(self._running)
            )
        seen: set[str] = set()
        for job in jobs:
            attempt_id = (job.metadata.annotations or {}).get(LABEL_ATTEMPT)
            rollout_id = (job.metadata.annotations or {}).get(LABEL_ROLLOUT)
            running = self._running.get(attempt_id or "")
            if running is None:
                if not await self._is_live(rollout_id, attempt_id):
                    logger.info("deleting Job %s: its attempt is not running", job.metadata.name)
                    await self._delete(job.metadata.name)
                continue
            seen.add(running.claimed.attempt.attempt_id)
            await self._follow(running, job)
        for attempt_id, running in list(self._running.items()):
            created = running.created_monotonic
            if attempt_id not in seen and created is not None and created < listed_at:
                where = f"namespace {self.settings.namespace}"
                error = f"Job {running.job_name} disappeared from {where} before it finished"
                await self._report(running, "failed", error)

    async def _follow(self, running: _Running, job: Any) -> None:
        """Record a finished Job's outcome and delete it; delete a Job whose attempt the store ended."""
        name = running.job_name
        for condition in (job.status.conditions if job.status else None) or []:
            if condition.status != "True" or condition.type not in ("Complete", "Failed"):
                continue
            if condition.type == "Complete":
                await self._report(running, "succeeded", None)
            elif condition.reason == "DeadlineExceeded":
                deadline = job.spec.active_deadline_seconds
                await self._report(
                    running, "timeout", f"Job {name} ran past its activeDeadlineSeconds ({deadline})"
                )
            else:
                why = f"{condition.reason}: {condition.message}" if condition.reason else "no reason given"
                where = f"namespace {self.settings.namespace}"
                error = f"Job {name} in {where} failed ({why}); its pod's log says why"
                await self._report(running, "failed", error)
            await self._delete(name)
            return
        claimed = running.claimed
        if not await self._is_live(claimed.rollout_id, claimed.attempt.attempt_id):
            logger.info("deleting Job %s: the store ended its attempt", name)
            self._forget(claimed.attempt.attempt_id)
            await self._delete(name)

    async def _is_live(self, rollout_id: str | None, attempt_id: str | None) -> bool:
        if rollout_id is None or attempt_id is None:
            return False
        try:
            attempts = await self.store.list_attempts(rollout_id)
        except NotFoundError:
            return False
        return any(a.attempt_id == attempt_id and a.is_live for a in attempts)

    async def _report(self, running: _Running, status: AttemptStatus, error: str | None) -> None:
        claimed = running.claimed
        self._forget(claimed.attempt.attempt_id)
        try:
            await self.store.update_attempt(
                claimed.rollout_id, claimed.attempt.attempt_id, status=status, error=error
            )
        except (InvalidTransitionError, NotFoundError) as failure:
            logger.info("attempt %s already ended: %s", claimed.attempt.attempt_id, failure)
        except FulgorError as failure:
            logger.error("could not report attempt %s as %s: %s", claimed.attempt.attempt_id, status, failure)

    def _forget(self, attempt_id: str) -> None:
        if self._running.pop(attempt_id, None) is not None:
            self._slot_freed.set()

    # -- the API ------------------------------------------------------------------------------------

    async def _list_jobs(self) -> list[Any]:
        listing = await self._call(
            "list",
            None,
            self.api.list_namespaced_job,
            self.settings.namespace,
            label_selector=f"{LABEL_RUN}={self.settings.run}",
        )
        return list(listing.items)

    async def _delete(self, name: str) -> None:
        try:
            await self._call(
                "delete",
                name,
                self.api.delete_namespaced_job,
                name,
                self.settings.namespace,
                propagation_policy="Background",
            )
        except FulgorError as failure:
            if "NotFound" not in str(failure):
                logger.error("%s", failure)

    async def _call(self, verb: str, name: str | None, method: Any, *args: Any, **kwargs: Any) -> Any:
        """One API call on a thread; a FulgorError that names the Job, the API's reason and its message."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return await asyncio.to_thread(method, *args, **kwargs)
        except ApiException as error:
            what = f"Job {name}" if name else "Jobs"
            where = f"namespace {self.settings.namespace}"
            failure = FulgorError(
                f"could not {verb} {what} in {where}: HTTP {error.status} {_status_reason(error)}"
            )
            # Its traceback holds the client's frames, whose response holds a connection: dropped
            # now, the socket closes now rather than at some later garbage collection.
            error.__traceback__ = None
        except (HTTPError, OSError) as error:  # the API server unreachable
            failure = FulgorError(f"could not reach the Kubernetes API to {verb} Jobs: {error}")
            error.__traceback__ = None
        raise failure  # outside the handlers: no context chained to the client's exception


def _status_reason(error: Any) -> str:
    """``Reason: message`` from the API's Status body, else the HTTP reason."""
    try:
        body = json.loads(error.body)
        return f"{body['reason']}: {body['message']}"
    except (ValueError, TypeError, KeyError):
        return str(error.reason)
