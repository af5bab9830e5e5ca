"""The worker loop: claim a rollout, run the agent, report the outcome; never lose a rollout.

One ``Runner`` runs up to ``max_concurrency`` rollouts at once on one event loop. It claims with a
long-poll (the store sleeps on an event), sends heartbeats so the store's watchdog knows the worker
is alive, enforces each rollout's ``timeout_seconds`` by cancelling the agent, stops an agent whose
rollout was cancelled or whose attempt the store already ended, and on shutdown stops claiming,
gives running rollouts a grace period and then cancels them (their attempts are marked failed,
so the store requeues or fails them by their retry config: nothing stays stuck).

What it does not know: how agents talk to models (the LLM resource it hands them points at the
gateway) or how many processes run it (the pool's job).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from fulgor.agent.agents_sdk import name_agents_sdk_calls
from fulgor.agent.base import Runnable
from fulgor.agent.context import RolloutContext, use_context
from fulgor.agent.emit import emit_exception
from fulgor.agent.langgraph import name_langgraph_calls
from fulgor.credentials import attempt_credential
from fulgor.errors import FulgorError, InvalidTransitionError, NotFoundError
from fulgor.semconv import ATTEMPT_SPANS_LOST
from fulgor.store.base import Store
from fulgor.store.client import TOKEN_ENV
from fulgor.store.writer import SpanWriter
from fulgor.types import LLM, AttemptedRollout, AttemptStatus, JsonDict, Resource

__all__ = ["Runner", "RunnerConfig", "attempt_resources", "default_worker_id", "gateway_base_url"]

logger = logging.getLogger(__name__)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def gateway_base_url(gateway_url: str, rollout_id: str, attempt_id: str) -> str:
    """The per-rollout OpenAI base URL the gateway serves (docs/architecture.md, "Gateway URLs")."""
    return f"{gateway_url.rstrip('/')}/r/{rollout_id}/{attempt_id}/v1"


@dataclass(frozen=True)
class RunnerConfig:
    """How one runner claims and supervises rollouts."""

    max_concurrency: int = 1
    claim_wait_seconds: float = 5.0
    heartbeat_seconds: float = 5.0
    shutdown_grace_seconds: float = 10.0
    gateway_url: str | None = None
    """When set, every LLM resource's endpoint becomes the rollout's own gateway URL."""
    operator_key: str | None = field(default=None, repr=False)
    """With ``gateway_url``: the run's operator key, from which each attempt's credential is derived
    (:mod:`fulgor.credentials`); the agent gets its attempt's credential as its LLM resource's key,
    in place of the resource's own (the upstream's, which must not reach agents either), and never
    the operator key. None means ``$FULGOR_TOKEN`` (as ``fulgor gateway`` and ``fulgor serve`` read
    it), looked up per rollout rather than stored here, where it would travel with the config
    (command lines, logs); with neither, agents get no key (a gateway without one checks none)."""
    opentelemetry: bool = True
    """Record spans of the agent's own OpenTelemetry instrumentation (needs opentelemetry-sdk), name
    each model call made inside a span of an agent (``gen_ai.agent.name``: AutoGen's) by that agent
    (see :mod:`fulgor.agent.genai`), and instrument a LangChain or LangGraph agent when
    OpenTelemetry's LangChain instrumentation is installed (see
    :func:`fulgor.agent.otel.instrument_langchain`)."""
    span_retry_seconds: float = 30.0
    """How long a store that is away is retried before the agent's spans count as lost."""

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise FulgorError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.claim_wait_seconds <= 0 or self.heartbeat_seconds <= 0:
            raise FulgorError("claim_wait_seconds and heartbeat_seconds must be > 0")


class Runner:
    """Runs one agent's rollouts from a store until stopped."""

    def __init__(
        self,
        agent: Runnable,
        store: Store,
        *,
        worker_id: str | None = None,
        config: RunnerConfig | None = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.worker_id = worker_id or default_worker_id()
        self.config = config or RunnerConfig()
        # Keyed by attempt id: a retry of a rollout may start here while its previous attempt's task
        # is still finishing, and each must stay counted, cancellable and drained.
        self._active: dict[str, tuple[AttemptedRollout, asyncio.Task[None]]] = {}
        self._reported: set[str] = set()  # attempt ids whose outcome reached the store
        self._stopping = asyncio.Event()
        self.completed = 0

    def stop(self) -> None:
        """Stop claiming; ``run`` then drains running rollouts (see ``shutdown_grace_seconds``)."""
        self._stopping.set()

    async def run(self) -> None:
        """Claim and run rollouts until ``stop`` is called, then drain and return."""
        if self.config.opentelemetry:
            _install_opentelemetry_bridge()
        name_langgraph_calls()  # for rollouts whose llm serves each agent with its own model
        name_agents_sdk_calls()  # the SDK's calls name their agent in every rollout
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="fulgor-heartbeat")
        try:
            await self._claim_loop()
        finally:
            await self._drain()
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def run_attempt(self, claimed: AttemptedRollout) -> None:
        """Run the agent on one claimed rollout and report how its attempt ended."""
        writer = SpanWriter(self.store, retry_seconds=self.config.span_retry_seconds)
        writer.start()
        context = RolloutContext(
            rollout_id=claimed.rollout_id,
            attempt_id=claimed.attempt.attempt_id,
            writer=writer,
            agent_name=self.agent.name,
        )
        status: AttemptStatus = "succeeded"
        error: str | None = None
        cancelled = False
        try:
            resources = await self._resources_for(claimed)
            if any(isinstance(r, LLM) and r.agent_models for r in resources.values()):
                context = dataclasses.replace(context, names_agent_calls=True)
            with use_context(context):
                status, error = await self._run_agent(claimed, resources)
        except FulgorError as failure:
            status, error = "failed", f"{type(failure).__name__}: {failure}"
            logger.error("rollout %s could not start: %s", claimed.rollout_id, failure)
        except asyncio.CancelledError:
            # Shutdown, or the store ended the attempt: report it (a no-op in the latter case) so
            # the store can requeue the rollout instead of waiting for it forever.
            status, error, cancelled = "failed", "the runner shut down before the rollout finished", True
        finally:
            lost = await self._store_spans(claimed, writer)
        if lost and status == "succeeded":
            # Its trace is incomplete: failed, it is retried as its config allows, never trained on.
            status = "failed"
            error = f"{lost} span(s) of this attempt were not stored; the runner's log says which and why"
        await self._report(claimed, status, error, {ATTEMPT_SPANS_LOST: lost} if lost else None)
        if cancelled:
            raise asyncio.CancelledError

    async def _store_spans(self, claimed: AttemptedRollout, writer: SpanWriter) -> int:
        """Write what the agent recorded (the writer retries a store that is away); how many of the
        attempt's spans the store never got."""
        try:
            await writer.close()
        except Exception:  # the worker boundary: the attempt is reported, the runner goes on
            logger.exception("the span writer of rollout %s failed", claimed.rollout_id)
        lost = writer.lost_for(claimed.rollout_id) + writer.pending
        if lost:
            logger.error(
                "%d span(s) of rollout %s attempt %s were not stored; its attempt records %s=%d",
                lost,
                claimed.rollout_id,
                claimed.attempt.attempt_id,
                ATTEMPT_SPANS_LOST,
                lost,
            )
        return lost

    async def _run_agent(
        self, claimed: AttemptedRollout, resources: Mapping[str, Resource]
    ) -> tuple[AttemptStatus, str | None]:
        timeout = claimed.config.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                await self.agent.run(claimed.input, resources, claimed)
        except TimeoutError:
            return "timeout", f"agent did not finish within timeout_seconds={timeout}"
        except asyncio.CancelledError:
            emit_exception(asyncio.CancelledError("the runner cancelled this rollout"))
            raise
        except Exception as failure:  # the worker boundary: the attempt fails, the runner goes on
            emit_exception(failure)
            logger.warning("agent %s failed on rollout %s: %r", self.agent.name, claimed.rollout_id, failure)
            return "failed", f"{type(failure).__name__}: {failure}"
        return "succeeded", None

    async def _resources_for(self, claimed: AttemptedRollout) -> dict[str, Resource]:
        return await attempt_resources(self.store, claimed, self.config.gateway_url, self.config.operator_key)

    async def _report(
        self,
        claimed: AttemptedRollout,
        status: AttemptStatus,
        error: str | None,
        metadata: JsonDict | None = None,
    ) -> None:
        try:
            await self.store.update_attempt(
                claimed.rollout_id, claimed.attempt.attempt_id, status=status, error=error, metadata=metadata
            )
        except (InvalidTransitionError, NotFoundError) as failure:
            # The store ended the attempt first (watchdog or cancel); its verdict stands.
            logger.info("attempt %s already ended: %s", claimed.attempt.attempt_id, failure)
        except FulgorError as failure:
            # The store cannot be reached: the attempt stays live until its unresponsive_seconds
            # (if set) lets the watchdog end and retry it.
            logger.error("could not report attempt %s as %s: %s", claimed.attempt.attempt_id, status, failure)
        self._reported.add(claimed.attempt.attempt_id)
        self.completed += 1

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            free = self.config.max_concurrency - len(self._active)
            if free <= 0:
                await self._wait_for_a_slot()
                continue
            claim = asyncio.create_task(
                self.store.claim(self.worker_id, limit=free, wait_seconds=self.config.claim_wait_seconds)
            )
            stop = asyncio.create_task(self._stopping.wait())
            await asyncio.wait({claim, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            try:
                # Stopping mid-claim: the claim still finishes, so nothing it took is left unrun.
                claimed_now = await claim
            except FulgorError as failure:
                # The store is unreachable or refused: nothing was claimed; try again shortly.
                logger.warning(
                    "claim failed (%s); retrying in %.1fs", failure, self.config.claim_wait_seconds
                )
                await self._sleep_unless_stopping(self.config.claim_wait_seconds)
                continue
            for claimed in claimed_now:
                self._start(claimed)

    async def _sleep_unless_stopping(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    def _start(self, claimed: AttemptedRollout) -> None:
        task = asyncio.create_task(self.run_attempt(claimed), name=f"fulgor-rollout-{claimed.rollout_id}")
        attempt_id = claimed.attempt.attempt_id
        self._active[attempt_id] = (claimed, task)
        task.add_done_callback(lambda _: self._active.pop(attempt_id, None))

    async def _wait_for_a_slot(self) -> None:
        tasks = {task for _, task in self._active.values()}
        stop = asyncio.create_task(self._stopping.wait())
        await asyncio.wait({*tasks, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()

    async def _drain(self) -> None:
        """Give running rollouts the grace period, then cancel them (each reports its attempt failed)."""
        running = list(self._active.values())
        if not running:
            return
        tasks = [task for _, task in running]
        grace = self.config.shutdown_grace_seconds
        logger.info("waiting up to %.0fs for %d running rollouts", grace, len(tasks))
        _, pending = await asyncio.wait(tasks, timeout=grace) if grace > 0 else (set(), set(tasks))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for claimed, _ in running:
            # A task cancelled before it started never ran its own report.
            if claimed.attempt.attempt_id not in self._reported:
                await self._report(claimed, "failed", "the runner shut down before the rollout started")

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                # Only the attempts this runner runs: one it never heard of (a claim whose answer
                # was lost) is left to the watchdog, which retries it.
                await self.store.heartbeat(
                    self.worker_id,
                    {"active": len(self._active), "completed": self.completed},
                    attempt_ids=list(self._active),
                )
                await self._stop_ended_attempts()
            except FulgorError as failure:
                logger.warning("heartbeat failed: %s", failure)
            await asyncio.sleep(self.config.heartbeat_seconds)

    async def _stop_ended_attempts(self) -> None:
        """Cancel agents whose rollout was cancelled or whose attempt the store's watchdog ended."""
        for claimed, task in list(self._active.values()):
            attempts = await self.store.list_attempts(claimed.rollout_id)
            mine = next((a for a in attempts if a.attempt_id == claimed.attempt.attempt_id), None)
            if mine is not None and not mine.is_live and not task.done():
                logger.info("stopping rollout %s: its attempt is %s", claimed.rollout_id, mine.status)
                task.cancel()


async def attempt_resources(
    store: Store, claimed: AttemptedRollout, gateway_url: str | None, operator_key: str | None
) -> dict[str, Resource]:
    """The resources the agent of ``claimed`` gets: its resources version, and with a
    ``gateway_url`` every LLM's endpoint its attempt's gateway URL and its key the attempt's
    credential (derived from ``operator_key``, else ``$FULGOR_TOKEN``; none without either)."""
    version = await store.get_resources(claimed.resources_id)
    resources: dict[str, Resource] = dict(version.resources) if version else {}
    if gateway_url is not None:
        url = gateway_base_url(gateway_url, claimed.rollout_id, claimed.attempt.attempt_id)
        # The run's key as `fulgor serve` and `fulgor gateway` read it (stripped alike).
        key = operator_key or os.environ.get(TOKEN_ENV, "").strip() or None
        attempt_id = claimed.attempt.attempt_id
        credential = None if key is None else attempt_credential(key, claimed.rollout_id, attempt_id)
        update = {"endpoint": url, "api_key": credential}
        for name, resource in resources.items():
            if isinstance(resource, LLM):
                resources[name] = resource.model_copy(update=update)
    return resources


def _install_opentelemetry_bridge() -> None:
    from fulgor.agent import otel
    from fulgor.agent.genai import name_calls_by_agent_spans

    try:
        otel.install()
    except FulgorError as missing:
        logger.debug("OpenTelemetry spans will not be recorded: %s", missing)
        return
    name_calls_by_agent_spans()  # a call inside an agent's span (AutoGen's) names that agent
    if otel.instrument_langchain():
        logger.debug("LangChain is instrumented: each model call is attributed to its LangGraph node")
