"""Zero-code agents: any program, in any language, run once per rollout.

The program learns everything from its environment (docs/architecture.md, "Zero-code agents"):

=====================  ==========================================================================
``OPENAI_BASE_URL``    the rollout's OpenAI-compatible base URL (the ``llm`` resource's endpoint)
``OPENAI_API_KEY``     the ``llm`` resource's key (a placeholder when it has none)
``ANTHROPIC_API_KEY``  the same key (the gateway takes it as ``x-api-key`` too)
``ANTHROPIC_BASE_URL`` the same URL without the trailing ``/v1`` (the Anthropic SDK appends it)
``FULGOR_BASE_URL``    the same URL without ``/v1``: the rollout's root on the gateway
``FULGOR_MODEL``       the ``llm`` resource's model name
``FULGOR_REWARD_URL``  ``POST {"value": 1.0}`` here (or ``{"values": {...}, "primary": ...}``;
                       either with ``"feedback": "..."``, the task's own words on the rollout)
``FULGOR_RESOURCES``   every resource of the rollout as JSON, by name (a prompt template's
                       text is ``["NAME"]["template"]``)
``FULGOR_ROLLOUT_ID``  the rollout id (``FULGOR_ATTEMPT_ID`` the attempt id)
``FULGOR_TASK``        the task input as JSON; left out when longer than 128 KiB (Linux refuses
                       a longer variable), so a program that may get large tasks reads the file
``FULGOR_TASK_FILE``   the path of a file holding the same JSON (always set; deleted afterwards)
=====================  ==========================================================================

A Python program can also call ``fulgor.emit_reward(1.0)``: outside a rollout it posts to
``FULGOR_REWARD_URL``.

The reward URL is served by a small HTTP endpoint on 127.0.0.1 inside the runner process, so it
works with an embedded SQLite store as well as with ``fulgor serve``. Each program runs in its own
process group; when the rollout times out, is cancelled or the runner shuts down, the whole group
is terminated (SIGTERM, then SIGKILL after ``kill_grace_seconds``), so no grandchild survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from fulgor.agent.context import AgentError, RolloutContext, current_context, use_context
from fulgor.agent.emit import emit_message, emit_reward
from fulgor.net.http_server import HttpReply, HttpRequest, HttpServer, error_reply, serve_http
from fulgor.store.client import TOKEN_ENV
from fulgor.types import LLM, Resource, Rollout

__all__ = ["TASK_ENV_LIMIT_BYTES", "ProgramResult", "SubprocessAgent", "zero_code_environment"]

logger = logging.getLogger(__name__)

_OUTPUT_LIMIT_BYTES = 64 * 1024
_BODY_LIMIT_BYTES = 64 * 1024
_ENDED_KEPT = 10_000  # ended attempts whose reward URL still answers 409 rather than 404
# Linux's MAX_ARG_STRLEN (32 pages): one longer "NAME=value" string fails exec with E2BIG.
TASK_ENV_LIMIT_BYTES = 128 * 1024 - len("FULGOR_TASK=") - 1


@dataclass(frozen=True)
class ProgramResult:
    """What a finished program left behind, for an optional reward function."""

    task: Any
    exit_code: int
    stdout: str
    stderr: str


class SubprocessAgent:
    """Runs ``command`` once per rollout with the environment contract above.

    ``reward_fn(result) -> float | None`` turns the program's output into a reward when the
    program does not post one itself; it runs in a thread, so a slow check does not hold up the
    runner's heartbeats and other rollouts. Without a reward function, a non-zero exit code fails the
    attempt (the tail of stderr is the error).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        name: str | None = None,
        reward_fn: Callable[[ProgramResult], float | None] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        kill_grace_seconds: float = 2.0,
    ) -> None:
        if not command:
            raise AgentError("SubprocessAgent needs a command, e.g. ['python', 'agent.py']")
        self.command = list(command)
        self.name = name or os.path.basename(self.command[-1])
        self.reward_fn = reward_fn
        self.env = dict(env or {})
        self.cwd = cwd
        self.kill_grace_seconds = kill_grace_seconds
        self._rewards = _RewardEndpoint()

    async def run(self, task: Any, resources: Mapping[str, Resource], rollout: Rollout) -> float | None:
        context = current_context()
        task_json = json.dumps(task)
        reward_url = await self._rewards.register(context)
        try:
            with _task_file(task_json) as task_path:
                env = self._environment(resources, context, reward_url, task_json, task_path)
                result = await self._run_program(env, task)
        finally:
            self._rewards.unregister(context)
        if result.stdout:
            emit_message(result.stdout[-_OUTPUT_LIMIT_BYTES:])
        if self.reward_fn is not None:
            # In a thread (with this rollout's context): a slow check must not block the event loop.
            reward = await asyncio.to_thread(self.reward_fn, result)
            return None if reward is None else emit_reward(reward).value
        if result.exit_code != 0:
            raise AgentError(
                f"{self.command[0]} exited with code {result.exit_code}: {result.stderr[-2000:]}"
            )
        return None

    def _environment(
        self,
        resources: Mapping[str, Resource],
        context: RolloutContext,
        reward_url: str,
        task_json: str,
        task_path: str,
    ) -> dict[str, str]:
        env = {**os.environ, **self.env}
        # The program gets its attempt's credential (the llm resource's key), never the run's key.
        env.pop(TOKEN_ENV, None)
        env.pop("FULGOR_TASK", None)  # not one inherited from the runner's own environment
        zero_code = zero_code_environment(
            resources, context.rollout_id, context.attempt_id, reward_url, task_json
        )
        env.update(zero_code, FULGOR_TASK_FILE=task_path)
        return env

    async def _run_program(self, env: dict[str, str], task: Any) -> ProgramResult:
        # Output goes to files, not pipes: a background child the program leaves behind keeps a
        # pipe open, and waiting for its end would hold the rollout until its timeout although
        # the program itself has exited (and on Python 3.11 even process.wait() waits for pipes).
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                env=env,
                cwd=self.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # its own process group, so the whole tree can be stopped
            )
            try:
                await process.wait()
            except BaseException:
                await self._stop_group(process)
                raise
            _kill_group(process.pid)  # whatever the program left running in its group goes with it
            return ProgramResult(
                task=task,
                exit_code=process.returncode if process.returncode is not None else -1,
                stdout=_tail(stdout),
                stderr=_tail(stderr),
            )

    async def _stop_group(self, process: asyncio.subprocess.Process) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), timeout=self.kill_grace_seconds)
                # The leader is gone; make sure nothing it started lingers in its group.
                os.killpg(process.pid, signal.SIGKILL)
                return
            except TimeoutError:
                continue
            except ProcessLookupError:
                return


def zero_code_environment(
    resources: Mapping[str, Resource], rollout_id: str, attempt_id: str, reward_url: str, task_json: str
) -> dict[str, str]:
    """The variables of the table above that a program learns its rollout from (all but
    ``FULGOR_TASK_FILE``); ``FULGOR_TASK`` only when ``task_json`` fits in one variable."""
    env: dict[str, str] = {}
    llm = resources.get("llm") or next((r for r in resources.values() if isinstance(r, LLM)), None)
    if isinstance(llm, LLM):
        root = llm.endpoint.rstrip("/").removesuffix("/v1")
        env.update(
            OPENAI_BASE_URL=llm.endpoint,
            OPENAI_API_KEY=llm.api_key or "fulgor",
            ANTHROPIC_API_KEY=llm.api_key or "fulgor",  # the gateway takes the same key as x-api-key
            ANTHROPIC_BASE_URL=root,
            FULGOR_BASE_URL=root,
            FULGOR_MODEL=llm.model,
        )
    env.update(
        FULGOR_RESOURCES=json.dumps({name: r.model_dump(mode="json") for name, r in resources.items()}),
        FULGOR_REWARD_URL=reward_url,
        FULGOR_ROLLOUT_ID=rollout_id,
        FULGOR_ATTEMPT_ID=attempt_id,
    )
    if len(task_json.encode()) <= TASK_ENV_LIMIT_BYTES:
        env["FULGOR_TASK"] = task_json
    return env


class _RewardEndpoint:
    """``POST /reward/{token}`` on 127.0.0.1: rewards from programs, recorded under their rollout.

    Each running program gets an unguessable token in its URL, so one program cannot post into
    another's rollout; once its attempt has ended, the URL answers 409 (while the endpoint serves
    other programs; with none left it closes its port).
    """

    def __init__(self) -> None:
        self._server: HttpServer | None = None
        self._port = 0
        self._contexts: dict[str, RolloutContext] = {}
        self._tokens: dict[str, str] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()  # tokens of ended attempts, the newest
        # Rollouts that start together must share one server, not each start one (and leak all but
        # the last). Made on first use and dropped with the server: a lock is bound to one loop.
        self._starting: asyncio.Lock | None = None

    async def register(self, context: RolloutContext) -> str:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._server is None:
                self._server = await serve_http(
                    self._handle, "127.0.0.1", 0, max_body_bytes=_BODY_LIMIT_BYTES
                )
                self._port = self._server.sockets[0].getsockname()[1]
        token = secrets.token_urlsafe(16)
        self._contexts[token] = context
        self._tokens[context.attempt_id] = token
        return f"http://127.0.0.1:{self._port}/reward/{token}"

    def unregister(self, context: RolloutContext) -> None:
        """Forget the rollout; the last one out closes the port."""
        token = self._tokens.pop(context.attempt_id, None)
        if token is not None:
            self._contexts.pop(token, None)
            self._ended[token] = None
            while len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
        if not self._contexts and self._server is not None:
            self._server.close()
            self._server = None
            self._starting = None
            self._ended.clear()

    async def _handle(self, request: HttpRequest) -> HttpReply:
        if request.method != "POST":
            return error_reply(405, "method_not_allowed", 'POST {"value": 1.0} to this URL')
        token = request.path.removeprefix("/reward/")
        context = self._contexts.get(token)
        if context is None and token in self._ended:
            return error_reply(409, "attempt_ended", "this attempt has ended; it takes no more rewards")
        if context is None:
            return error_reply(404, "not_found", "this reward URL belongs to no running rollout")
        return self._record(context, request.body)

    def _record(self, context: RolloutContext, body: bytes) -> HttpReply:
        try:
            data = json.loads(body)
            value = data["values"] if "values" in data else data["value"]
            with use_context(context):
                reward = emit_reward(value, primary=data.get("primary"), feedback=data.get("feedback"))
        # ValueError: not JSON, or not UTF-8 (UnicodeDecodeError); RecursionError: absurd nesting.
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return error_reply(
                400,
                "validation_error",
                'send JSON like {"value": 1.0} or {"values": {...}, "primary": "..."}',
            )
        except AgentError as error:
            return error_reply(400, "validation_error", error.message)
        return HttpReply(body=json.dumps({"value": reward.value, "primary": reward.primary}).encode())


@contextlib.contextmanager
def _task_file(task_json: str) -> Iterator[str]:
    """A private temporary file holding the task's JSON, deleted when the block ends."""
    descriptor, path = tempfile.mkstemp(prefix="fulgor-task-", suffix=".json")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(task_json)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):  # the program may have removed it itself
            os.unlink(path)


def _tail(output: IO[bytes]) -> str:
    """The last ``_OUTPUT_LIMIT_BYTES`` a program wrote to ``output``."""
    output.seek(max(0, output.seek(0, os.SEEK_END) - _OUTPUT_LIMIT_BYTES))
    return output.read().decode(errors="replace")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
