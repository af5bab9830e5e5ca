"""A simulated Kubernetes API server for Jobs: real HTTP on loopback, real Kubernetes JSON, local processes.

This is a simulation, not Kubernetes: it serves the part of the REST API that
:class:`~fulgor.training.runners.KubernetesRunners` uses, so that the official ``kubernetes`` client
can be pointed at it (:meth:`SimulatedKubernetesAPI.write_kubeconfig`) and a test can watch Jobs run:

==========================================================  =============================================
``POST   /apis/batch/v1/namespaces/{ns}/jobs``              create (201 the Job; 409 ``AlreadyExists``;
                                                            422 ``Invalid``; 400 ``BadRequest``)
``GET    /apis/batch/v1/namespaces/{ns}/jobs``              list (``labelSelector``: ``k=v``, ``k==v``,
                                                            ``k!=v``, ``k``, ``!k``, comma-separated)
``GET    /apis/batch/v1/namespaces/{ns}/jobs/{name}``       read (404 ``NotFound``)
``DELETE /apis/batch/v1/namespaces/{ns}/jobs/{name}``       delete (a ``Status``; ``propagationPolicy``
                                                            from the query or a ``DeleteOptions`` body)
==========================================================  =============================================

Errors are ``Status`` objects (``kind``, ``status: Failure``, ``message``, ``reason``, ``code``) as
the API server sends them; with a ``token``, a request without ``Authorization: Bearer TOKEN`` gets
401 ``Unauthorized``. Each created Job "runs" at once: its pod template's first container's
``command`` + ``args`` start as a local process (in its own process group) with this process's
environment plus the container's ``env`` (``value`` entries; ``valueFrom`` is not simulated) in its
``workingDir``. Exit 0 completes the Job (condition ``Complete``); another exit code fails it
(``Failed``, reason ``BackoffLimitExceeded``: no pod is retried, whatever ``backoffLimit`` says); a
process still running ``activeDeadlineSeconds`` after the Job started is killed and the Job fails
with reason ``DeadlineExceeded``. Deleting a Job kills its process group, as the pod's deletion
would. What no simulation gives: images, scheduling, nodes, pods as objects, a pod's containers
other than its first (a template whose agent runs in a later container, beside a sidecar, runs the
sidecar here), watches, RBAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from fulgor.net.http_server import HttpReply, HttpRequest, HttpServer, serve_http
from fulgor.testing._loop_thread import LoopThread

__all__ = ["SimulatedJob", "SimulatedKubernetesAPI"]

_JOBS = "/apis/batch/v1/namespaces/"
_OUTPUT_KEPT_BYTES = 16 * 1024


@dataclass
class SimulatedJob:
    """One Job the simulation holds: its object as the API returns it, and its process."""

    body: dict[str, Any]
    created_monotonic: float
    process: asyncio.subprocess.Process | None = None
    output_path: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


class SimulatedKubernetesAPI:
    """A simulated Kubernetes API server for Jobs (see the module docstring); ``with`` serves it on a
    thread of its own, and leaving the block kills every Job's process."""

    def __init__(self, *, token: str | None = None, host: str = "127.0.0.1") -> None:
        self.token = token
        self._host = host
        self._jobs: dict[tuple[str, str], SimulatedJob] = {}
        self._versions = itertools.count(1)
        self._server: HttpServer | None = None
        self._thread = LoopThread("simulated-kubernetes-api")
        self._lock = threading.Lock()
        self.creations: list[tuple[str, float]] = []
        """Each Job created, as (name, monotonic time of its creation), in order."""
        self.created: list[dict[str, Any]] = []
        """Each Job created, as the API answered its creation (copies), in order."""
        self.deletions: list[tuple[str, str | None]] = []
        """Each Job deleted, as (name, the propagationPolicy asked for)."""
        self.requests: list[tuple[str, str]] = []
        """Each request, as (method, path without the query), in order."""

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the simulated API server is not started; use `with` first")
        port = self._server.sockets[0].getsockname()[1]
        return f"http://{self._host}:{port}"

    def __enter__(self) -> SimulatedKubernetesAPI:
        self._thread.start(self._open, self._close)
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.stop(30)

    async def _open(self) -> None:
        self._server = await serve_http(self._handle, self._host, 0)

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for job in list(self._jobs.values()):
            await self._end_process(job)
        await self._server.wait_closed()
        # Connections a client keeps open (the kubernetes client's pool) end with the server.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig file whose current context is this server (with its token, if any)."""
        user: dict[str, Any] = {"token": self.token} if self.token is not None else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "simulated", "cluster": {"server": self.url}}],
            "users": [{"name": "simulated", "user": user}],
            "contexts": [
                {
                    "name": "simulated",
                    "context": {"cluster": "simulated", "user": "simulated", "namespace": namespace},
                }
            ],
            "current-context": "simulated",
        }
        path.write_text(json.dumps(config))  # JSON is YAML: the client's loader reads it
        return path

    # -- what tests look at -----------------------------------------------------------------------

    def jobs(self, namespace: str = "default") -> list[dict[str, Any]]:
        """The Jobs of ``namespace`` as the API would return them (copies)."""
        with self._lock:
            return [copy.deepcopy(j.body) for (ns, _), j in self._jobs.items() if ns == namespace]

    def processes_running(self) -> int:
        """How many Jobs' processes have not exited."""
        with self._lock:
            return sum(
                1 for j in self._jobs.values() if j.process is not None and j.process.returncode is None
            )

    def output(self, name: str, namespace: str = "default") -> str:
        """What the Job's process wrote (stdout and stderr), its last 16 KiB."""
        with self._lock:
            job = self._jobs.get((namespace, name))
        if job is None or job.output_path is None:
            return ""
        data = Path(job.output_path).read_bytes()
        return data[-_OUTPUT_KEPT_BYTES:].decode(errors="replace")

    # -- protocol ---------------------------------------------------------------------------------

    async def _handle(self, request: HttpRequest) -> HttpReply:
        if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        parts = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = unquote(parts.path)
        with self._lock:
            self.requests.append((request.method, path))
        if not path.startswith(_JOBS):
            return _status(404, "NotFound", "the server could not find the requested resource")
        segments = path[len(_JOBS) :].split("/")
        if len(segments) == 2 and segments[1] == "jobs":
            if request.method == "POST":
                return await self._create(segments[0], request.body)
            if request.method == "GET":
                return self._list(segments[0], query.get("labelSelector", ""))
        elif len(segments) == 3 and segments[1] == "jobs":
            if request.method == "GET":
                return self._read(segments[0], segments[2])
            if request.method == "DELETE":
                return await self._delete(segments[0], segments[2], query, request.body)
        elif len(segments) >= 2 and segments[1] == "jobs":
            return _status(404, "NotFound", "the server could not find the requested resource")
        return _status(405, "MethodNotAllowed", f"the server does not allow this method on {path}")

    async def _create(self, namespace: str, raw: bytes) -> HttpReply:
        try:
            body = json.loads(raw)
        except ValueError:
            return _status(400, "BadRequest", "the body of the request was in an unknown format")
        if not isinstance(body, dict):
            return _status(400, "BadRequest", "the body of the request was in an unknown format")
        metadata = body.setdefault("metadata", {})
        if metadata.get("namespace", namespace) != namespace:
            return _status(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        problem = _invalid(body)
        name = str(metadata.get("name") or "")
        if problem is not None:
            return _status(422, "Invalid", f'Job.batch "{name}" is invalid: {problem}', name=name)
        if (namespace, name) in self._jobs:
            return _status(409, "AlreadyExists", f'jobs.batch "{name}" already exists', name=name)
        body.update(apiVersion="batch/v1", kind="Job")
        metadata.update(
            namespace=namespace,
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._versions)),
            creationTimestamp=_now(),
            generation=1,
        )
        body["status"] = {}
        job = SimulatedJob(body, time.monotonic())
        with self._lock:
            self._jobs[(namespace, name)] = job
            self.creations.append((name, job.created_monotonic))
            self.created.append(copy.deepcopy(body))
        job.task = asyncio.get_running_loop().create_task(self._run(job))
        return _json(201, body)

    def _list(self, namespace: str, selector: str) -> HttpReply:
        try:
            match = _selector(selector)
        except ValueError as error:
            return _status(400, "BadRequest", f"unable to parse requirement: {error}")
        with self._lock:
            items = [
                copy.deepcopy(j.body)
                for (ns, _), j in self._jobs.items()
                if ns == namespace and match(j.body["metadata"].get("labels") or {})
            ]
        listing = {
            "kind": "JobList",
            "apiVersion": "batch/v1",
            "metadata": {"resourceVersion": str(next(self._versions))},
            "items": items,
        }
        return _json(200, listing)

    def _read(self, namespace: str, name: str) -> HttpReply:
        with self._lock:
            job = self._jobs.get((namespace, name))
        if job is None:
            return _status(404, "NotFound", f'jobs.batch "{name}" not found', name=name)
        return _json(200, job.body)

    async def _delete(self, namespace: str, name: str, query: Mapping[str, str], raw: bytes) -> HttpReply:
        policy = query.get("propagationPolicy")
        if raw:
            with contextlib.suppress(ValueError, AttributeError):
                policy = json.loads(raw).get("propagationPolicy", policy)
        with self._lock:
            job = self._jobs.pop((namespace, name), None)
            if job is not None:
                self.deletions.append((name, policy))
        if job is None:
            return _status(404, "NotFound", f'jobs.batch "{name}" not found', name=name)
        await self._end_process(job)
        details = {"name": name, "group": "batch", "kind": "jobs", "uid": job.body["metadata"]["uid"]}
        return _json(
            200,
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details},
        )

    # -- running Jobs -----------------------------------------------------------------------------

    async def _run(self, job: SimulatedJob) -> None:
        spec = job.body["spec"]
        container = spec["template"]["spec"]["containers"][0]
        env = {**os.environ, **{e["name"]: str(e.get("value", "")) for e in container.get("env") or []}}
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        descriptor, job.output_path = tempfile.mkstemp(prefix=f"simulated-job-{job.name}-", suffix=".log")
        started = datetime.now(UTC)
        job.body["status"] = {"active": 1, "startTime": _now(started), "ready": 0}
        try:
            with os.fdopen(descriptor, "wb") as output:
                job.process = await asyncio.create_subprocess_exec(
                    *command,
                    env=env,
                    cwd=container.get("workingDir"),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=output,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as error:
            self._finish(job, started, "Failed", "StartError", f"the container could not start: {error}")
            return
        deadline = spec.get("activeDeadlineSeconds")
        try:
            async with asyncio.timeout(None if deadline is None else float(deadline)):
                code = await job.process.wait()
        except TimeoutError:
            await self._end_process(job)
            self._finish(
                job, started, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline"
            )
            return
        _kill_group(job.process.pid)  # what the program left running goes with its pod
        if code == 0:
            self._finish(job, started, "Complete", None, None)
        else:
            self._finish(
                job, started, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            )

    def _finish(
        self, job: SimulatedJob, started: datetime, kind: str, reason: str | None, message: str | None
    ) -> None:
        now = _now()
        condition: dict[str, Any] = {
            "type": kind,
            "status": "True",
            "lastProbeTime": now,
            "lastTransitionTime": now,
        }
        if reason is not None:
            condition.update(reason=reason, message=message)
        status: dict[str, Any] = {"startTime": _now(started), "conditions": [condition], "ready": 0}
        if kind == "Complete":
            status.update(succeeded=1, completionTime=now)
        else:
            status["failed"] = 1
        with self._lock:
            job.body["status"] = status
            job.body["metadata"]["resourceVersion"] = str(next(self._versions))

    async def _end_process(self, job: SimulatedJob) -> None:
        """Kill the Job's process group (its pod going away) and wait for its process."""
        if job.task is not None and not job.task.done() and job.task is not asyncio.current_task():
            job.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job.task
        process = job.process
        if process is not None:
            _kill_group(process.pid)
            if process.returncode is None:
                await process.wait()
        if job.output_path is not None and job.task is not asyncio.current_task():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(job.output_path)
            job.output_path = None


def _invalid(body: dict[str, Any]) -> str | None:
    """What makes a Job invalid to the API server, as far as the simulation checks; None if valid."""
    if not body["metadata"].get("name"):
        return "metadata.name: Required value: name or generateName is required"
    spec = body.get("spec")
    pod = spec.get("template", {}).get("spec") if isinstance(spec, dict) else None
    if not isinstance(pod, dict) or not pod.get("containers"):
        return "spec.template.spec.containers: Required value"
    if pod.get("restartPolicy") not in ("Never", "OnFailure"):
        return 'spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"'
    if not pod["containers"][0].get("command"):
        return "spec.template.spec.containers[0].command: Required value: the simulation runs no images"
    return None


def _selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over labels for a label selector (equality and existence requirements)."""
    requirements = [_requirement(part.strip()) for part in text.split(",") if part.strip()]
    return lambda labels: all(requirement(labels) for requirement in requirements)


def _requirement(text: str) -> Callable[[Mapping[str, str]], bool]:
    for operator in ("!=", "==", "="):
        if operator in text:
            key, value = (side.strip() for side in text.split(operator, 1))
            if not key:
                raise ValueError(text)
            equal = operator != "!="
            return lambda labels: (labels.get(key) == value) == equal
    absent = text.startswith("!")
    key = text.removeprefix("!").strip()
    return lambda labels: (key in labels) != absent


def _status(code: int, reason: str, message: str, *, name: str | None = None) -> HttpReply:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name is not None:
        body["details"] = {"name": name, "group": "batch", "kind": "jobs"}
    return _json(code, body)


def _json(code: int, body: Mapping[str, Any]) -> HttpReply:
    return HttpReply(code, json.dumps(body).encode())


def _now(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
