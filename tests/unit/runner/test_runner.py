"""The worker loop against real stores: outcomes, timeouts, retries, cancellation and shutdown."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fulgor import semconv
from fulgor.agent import current_context, emit_message, emit_reward, rollout
from fulgor.runner import Runner, RunnerConfig, gateway_base_url
from fulgor.store import MemoryStore, SqliteStore, Store
from fulgor.types import LLM, RolloutConfig, RolloutRequest

FAST = RunnerConfig(
    max_concurrency=4, claim_wait_seconds=0.2, heartbeat_seconds=0.05, shutdown_grace_seconds=0.5
)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    store: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "store.sqlite")
    yield store
    await store.close()


async def run_until_done(
    runner: Runner, store: Store, rollout_ids: list[str], wait_seconds: float = 20
) -> None:
    task = asyncio.create_task(runner.run())
    try:
        done = await store.wait(rollout_ids, timeout_seconds=wait_seconds)
        assert len(done) == len(rollout_ids), "rollouts did not finish"
    finally:
        runner.stop()
        await asyncio.wait_for(task, timeout=10)


@rollout
async def solver(task: dict[str, Any], llm: LLM) -> float | None:
    emit_message(f"calling {llm.endpoint}")
    if task["kind"] == "raise":
        raise RuntimeError("tool crashed")
    if task["kind"] == "hang":
        await asyncio.sleep(60)
    return 1.0 if task["kind"] == "right" else 0.0


async def test_outcomes_are_reported_and_spans_kept(store: Store) -> None:
    await store.put_resources({"llm": LLM(endpoint="http://upstream/v1", model="m")})
    rollouts = await store.enqueue(
        [RolloutRequest(input={"kind": kind}) for kind in ("right", "wrong", "raise", "right")]
    )
    runner = Runner(solver, store, worker_id="w1", config=FAST)
    await run_until_done(runner, store, [r.rollout_id for r in rollouts])

    statuses = [(await store.get_rollout(r.rollout_id)).status for r in rollouts]
    assert statuses == ["succeeded", "succeeded", "failed", "succeeded"]
    right = await store.query_spans(rollouts[0].rollout_id)
    assert [s.name for s in right] == [semconv.SPAN_MESSAGE, semconv.SPAN_REWARD]
    assert right[1].attributes[semconv.ATTR_REWARD_VALUE] == 1.0
    assert right[0].attributes[semconv.ATTR_AGENT_NAME] == "solver"
    raised = await store.query_spans(rollouts[2].rollout_id, name=semconv.SPAN_EXCEPTION)
    assert raised[0].attributes[semconv.ATTR_EXCEPTION_MESSAGE] == "tool crashed"
    [attempt] = await store.list_attempts(rollouts[2].rollout_id)
    assert attempt.error == "RuntimeError: tool crashed"
    assert [w.worker_id for w in await store.list_workers()] == ["w1"]


async def test_gateway_url_is_handed_to_the_agent_per_rollout(store: Store) -> None:
    seen: list[str] = []

    @rollout
    def agent(llm: LLM) -> float:
        seen.append(llm.endpoint)
        return 1.0

    await store.put_resources({"llm": LLM(endpoint="http://engine/v1", model="m")})
    [created] = await store.enqueue([RolloutRequest(input={})])
    config = RunnerConfig(claim_wait_seconds=0.2, gateway_url="http://127.0.0.1:7000/")
    await run_until_done(Runner(agent, store, config=config), store, [created.rollout_id])
    [attempt] = await store.list_attempts(created.rollout_id)
    assert seen == [gateway_base_url("http://127.0.0.1:7000", created.rollout_id, attempt.attempt_id)]
    assert seen[0] == f"http://127.0.0.1:7000/r/{created.rollout_id}/{attempt.attempt_id}/v1"


@pytest.mark.parametrize(
    ("configured", "environment", "expected"),
    [("run-key", "env-key", "run-key"), (None, "env-key", "env-key"), (None, None, None)],
)
async def test_through_the_gateway_agents_get_their_attempts_credential_never_a_key(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    configured: str | None,
    environment: str | None,
    expected: str | None,
) -> None:
    """Neither the operator key nor the upstream's key reaches an agent: only the credential of its
    own attempt, derived from the operator key."""
    from fulgor.credentials import attempt_credential

    seen: list[str | None] = []

    @rollout
    def agent(llm: LLM) -> float:
        seen.append(llm.api_key)
        return 1.0

    if environment is None:
        monkeypatch.delenv("FULGOR_TOKEN", raising=False)
    else:
        monkeypatch.setenv("FULGOR_TOKEN", environment)
    await store.put_resources({"llm": LLM(endpoint="http://engine/v1", model="m", api_key="upstream-secret")})
    [created] = await store.enqueue([RolloutRequest(input={})])
    config = RunnerConfig(
        claim_wait_seconds=0.2, gateway_url="http://127.0.0.1:7000", operator_key=configured
    )
    assert "run-key" not in repr(config)
    await run_until_done(Runner(agent, store, config=config), store, [created.rollout_id])
    [attempt] = await store.list_attempts(created.rollout_id)
    credential = attempt_credential(expected, created.rollout_id, attempt.attempt_id) if expected else None
    assert seen == [credential]


async def test_a_hanging_agent_times_out_and_is_retried(store: Store) -> None:
    await store.put_resources({"llm": LLM(endpoint="http://upstream/v1", model="m")})
    config = RolloutConfig(timeout_seconds=0.3, max_attempts=2)
    [created] = await store.enqueue([RolloutRequest(input={"kind": "hang"}, config=config)])
    started = time.monotonic()
    await run_until_done(Runner(solver, store, config=FAST), store, [created.rollout_id])
    assert time.monotonic() - started < 10
    assert (await store.get_rollout(created.rollout_id)).status == "failed"
    assert [a.status for a in await store.list_attempts(created.rollout_id)] == ["timeout", "timeout"]


@pytest.mark.parametrize("ending", ["cancel", "shutdown"])
async def test_a_retry_started_while_its_previous_attempt_finishes_is_tracked(
    store: Store, ending: str
) -> None:
    # The store times the first attempt out and requeues the rollout; this runner claims the retry
    # while the first attempt's agent is still cleaning up. The retry must stay counted in the
    # heartbeat, be stopped when the store ends it, and be drained on shutdown.
    started: list[str] = []
    stopped: set[str] = set()
    retry_started = asyncio.Event()

    @rollout
    async def hangs(task: Any) -> float:
        attempt_id = current_context().attempt_id
        started.append(attempt_id)
        if len(started) == 2:
            retry_started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            if attempt_id == started[0]:
                await asyncio.sleep(0.3)  # a cleanup that takes a moment
            raise
        finally:
            stopped.add(attempt_id)
        return 1.0

    config = RolloutConfig(timeout_seconds=1.5, max_attempts=3)
    [created] = await store.enqueue([RolloutRequest(input={}, config=config)])
    runner = Runner(hangs, store, worker_id="w1", config=FAST)
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(retry_started.wait(), timeout=10)
    await asyncio.sleep(0.5)  # the first attempt's task has ended; a few heartbeats went out
    assert started[0] in stopped
    [worker] = await store.list_workers()
    assert worker.stats["active"] == 1, "the running retry is not counted"
    if ending == "cancel":
        await store.cancel([created.rollout_id])
        for _ in range(20):  # the heartbeat (every 0.05 s) finds the ended attempt
            if started[1] in stopped:
                break
            await asyncio.sleep(0.05)
        assert started[1] in stopped, "the retry's agent was not stopped when the store ended it"
    runner.stop()
    await asyncio.wait_for(task, timeout=10)
    assert set(started) == stopped, "an agent was still running after the runner returned"
    attempts = await store.list_attempts(created.rollout_id)
    assert [a.attempt_id for a in attempts] == started
    assert attempts[0].status == "timeout"
    if ending == "shutdown":
        assert attempts[1].status == "failed"
        assert attempts[1].error is not None
        assert "shut down" in attempts[1].error


async def test_cancelling_a_rollout_stops_its_agent(store: Store) -> None:
    started, stopped = asyncio.Event(), asyncio.Event()

    @rollout
    async def waits(task: Any) -> float:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        return 1.0

    [created] = await store.enqueue([RolloutRequest(input={})])
    runner = Runner(waits, store, config=FAST)
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), timeout=5)
    await store.cancel([created.rollout_id])
    await asyncio.wait_for(stopped.wait(), timeout=5)
    runner.stop()
    await asyncio.wait_for(task, timeout=10)
    assert (await store.get_rollout(created.rollout_id)).status == "cancelled"


async def test_shutdown_gives_a_grace_period_then_fails_the_attempt_for_a_retry(store: Store) -> None:
    started = asyncio.Event()

    @rollout
    async def slow(task: dict[str, Any]) -> float:
        if task["seconds"] > 1:
            started.set()
        await asyncio.sleep(task["seconds"])
        return 1.0

    config = RolloutConfig(max_attempts=2)
    quick, stuck = await store.enqueue(
        [
            RolloutRequest(input={"seconds": 0.1}, config=config),
            RolloutRequest(input={"seconds": 60}, config=config),
        ]
    )
    runner = Runner(slow, store, config=FAST)
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), timeout=5)
    runner.stop()
    await asyncio.wait_for(task, timeout=10)
    assert (await store.get_rollout(quick.rollout_id)).status == "succeeded"
    # Not lost: the cut-short rollout is back in the queue for another runner.
    assert (await store.get_rollout(stuck.rollout_id)).status == "requeuing"
    [attempt] = await store.list_attempts(stuck.rollout_id)
    assert attempt.status == "failed"
    assert attempt.error is not None
    assert "shut down" in attempt.error


async def test_concurrency_is_bounded(store: Store) -> None:
    running = 0
    peak = 0

    @rollout
    async def counted(task: Any) -> float:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return 1.0

    rollouts = await store.enqueue([RolloutRequest(input=i) for i in range(12)])
    config = RunnerConfig(max_concurrency=3, claim_wait_seconds=0.2)
    await run_until_done(Runner(counted, store, config=config), store, [r.rollout_id for r in rollouts])
    assert peak == 3
    assert (await store.stats()).rollouts == {"succeeded": 12}


async def test_a_failing_claim_is_retried_not_fatal(store: Store) -> None:
    from fulgor.errors import StoreError

    failures = 2
    real_claim = store.claim

    async def flaky_claim(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise StoreError("the store is unreachable")
        return await real_claim(*args, **kwargs)

    store.claim = flaky_claim  # type: ignore[method-assign]
    [created] = await store.enqueue([RolloutRequest(input={"kind": "right"})])
    await store.put_resources({"llm": LLM(endpoint="http://upstream/v1", model="m")})
    config = RunnerConfig(claim_wait_seconds=0.05, heartbeat_seconds=0.05)
    await run_until_done(Runner(solver, store, config=config), store, [created.rollout_id])
    assert failures == 0
    assert (await store.get_rollout(created.rollout_id)).status == "succeeded"


@rollout
async def rewarded(task: Any) -> None:
    emit_reward(1.0)
    await asyncio.sleep(0.2)  # the span flusher writes while the agent still runs


def fail_span_writes(store: Store, failures: int) -> list[int]:
    """Make the next ``failures`` ``add_spans`` calls raise; returns a one-item list of calls made."""
    from fulgor.errors import StoreUnavailableError

    calls = [0]
    real_add_spans = store.add_spans

    async def flaky_add_spans(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] <= failures:
            raise StoreUnavailableError("the store is briefly unreachable")
        return await real_add_spans(*args, **kwargs)

    store.add_spans = flaky_add_spans  # type: ignore[method-assign]
    return calls


async def test_a_failed_span_write_is_retried_and_the_reward_kept(store: Store) -> None:
    calls = fail_span_writes(store, failures=1)
    [created] = await store.enqueue([RolloutRequest(input={})])
    await run_until_done(Runner(rewarded, store, config=FAST), store, [created.rollout_id])
    assert calls[0] >= 2
    assert (await store.get_rollout(created.rollout_id)).status == "succeeded"
    [reward] = await store.query_spans(created.rollout_id, name=semconv.SPAN_REWARD)
    assert reward.attributes[semconv.ATTR_REWARD_VALUE] == 1.0


async def test_spans_a_store_away_too_long_never_got_fail_the_attempt(store: Store) -> None:
    fail_span_writes(store, failures=1000)
    [created] = await store.enqueue([RolloutRequest(input={})])
    config = replace(FAST, span_retry_seconds=0.2)
    await run_until_done(Runner(rewarded, store, config=config), store, [created.rollout_id])
    [attempt] = await store.list_attempts(created.rollout_id)
    assert attempt.status == "failed"
    assert attempt.error == "1 span(s) of this attempt were not stored; the runner's log says which and why"
    assert attempt.metadata[semconv.ATTEMPT_SPANS_LOST] == 1


async def test_an_attempt_the_runner_never_heard_of_is_left_to_the_watchdog(store: Store) -> None:
    """A claim whose answer was lost (its retry reached another server) leaves an attempt under this
    worker's id that the runner does not run: its heartbeats must not keep that attempt alive."""
    await store.put_resources({"llm": LLM(endpoint="http://upstream/v1", model="m")})
    config = RolloutConfig(unresponsive_seconds=0.3, max_attempts=2)
    [created] = await store.enqueue([RolloutRequest(input={"kind": "right"}, config=config)])
    [orphan] = await store.claim("w1")  # claimed under the runner's worker id, never run
    runner = Runner(solver, store, worker_id="w1", config=FAST)
    await run_until_done(runner, store, [created.rollout_id])
    attempts = await store.list_attempts(created.rollout_id)
    assert [a.status for a in attempts] == ["unresponsive", "succeeded"]
    assert attempts[0].attempt_id == orphan.attempt.attempt_id


async def test_once_stopped_a_runner_claims_nothing_more(store: Store) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @rollout
    async def gated(task: Any) -> float:
        started.set()
        await release.wait()
        return 1.0

    running, queued = await store.enqueue([RolloutRequest(input=0), RolloutRequest(input=1)])
    config = RunnerConfig(max_concurrency=1, claim_wait_seconds=0.2, heartbeat_seconds=0.05)
    runner = Runner(gated, store, config=config)
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), timeout=5)
    runner.stop()
    release.set()  # the running rollout ends within its grace period and frees the slot
    await asyncio.wait_for(task, timeout=10)
    assert (await store.get_rollout(running.rollout_id)).status == "succeeded"
    # The freed slot took no new work: the queued rollout waits for another runner.
    assert (await store.get_rollout(queued.rollout_id)).status == "queuing"
    assert await store.list_attempts(queued.rollout_id) == []


async def test_an_agent_past_its_rollouts_timeout_is_stopped_while_the_runner_goes_on(store: Store) -> None:
    stopped = asyncio.Event()

    @rollout
    async def hangs(task: Any) -> float:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        return 1.0

    config = RolloutConfig(timeout_seconds=0.3, max_attempts=1)
    [created] = await store.enqueue([RolloutRequest(input={}, config=config)])
    runner = Runner(hangs, store, config=FAST)
    task = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(stopped.wait(), timeout=10)
        assert not task.done()  # stopped by the runner's timeout, not by a shutdown
    finally:
        runner.stop()
        await asyncio.wait_for(task, timeout=10)
    [attempt] = await store.list_attempts(created.rollout_id)
    assert attempt.status == "timeout"


# An agent instrumented with OpenTelemetry as its author wrote it, run by a runner in a process of
# its own: a fresh process, whose global tracer provider nothing but the runner has touched.
TRACED_AGENT_RUN = textwrap.dedent(
    """\
    import asyncio, sys
    from opentelemetry import trace
    from fulgor import rollout
    from fulgor.runner import Runner, RunnerConfig
    from fulgor.store import SqliteStore
    from fulgor.types import RolloutRequest

    @rollout
    async def traced(task):
        with trace.get_tracer("agent").start_as_current_span("lookup", attributes={"key": task["key"]}):
            with trace.get_tracer("agent").start_as_current_span("fetch"):
                pass
        return 1.0

    async def main(path):
        store = SqliteStore(path)
        [created] = await store.enqueue([RolloutRequest(input={"key": "k1"})])
        runner = Runner(traced, store, config=RunnerConfig(claim_wait_seconds=0.2, heartbeat_seconds=0.05))
        task = asyncio.create_task(runner.run())
        await store.wait([created.rollout_id], timeout_seconds=30)
        runner.stop()
        await task
        await store.close()

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_spans_of_the_agents_own_opentelemetry_instrumentation_land_under_its_rollout(
    tmp_path: Path,
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    path = tmp_path / "store.sqlite"
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", TRACED_AGENT_RUN, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    store = SqliteStore(path)
    try:
        [done] = await store.query_rollouts()
        assert done.status == "succeeded"
        spans = {s.name: s for s in await store.query_spans(done.rollout_id)}
    finally:
        await store.close()
    assert {"lookup", "fetch"} <= set(spans)
    assert spans["lookup"].attributes == {"key": "k1"}
    assert spans["fetch"].parent_id == spans["lookup"].span_id


@rollout
async def records_a_span_no_store_takes(task: dict[str, Any]) -> float:
    from fulgor.types import Span

    context = current_context()
    context.record(
        Span(
            rollout_id=context.rollout_id,
            attempt_id=context.attempt_id,
            trace_id=context.trace_id,
            span_id="bad",
            name="agent.step",
            start_time=0.0,
            attributes={"score": float("nan")},  # not JSON: every store refuses it
        )
    )
    return 1.0


async def test_an_attempt_records_how_many_of_its_spans_were_lost(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    [queued] = await store.enqueue([RolloutRequest(input={})])
    await run_until_done(
        Runner(records_a_span_no_store_takes, store, config=FAST), store, [queued.rollout_id]
    )
    [attempt] = await store.list_attempts(queued.rollout_id)
    assert attempt.status == "failed"  # its trace is incomplete: retried as allowed, never trained on
    assert attempt.metadata[semconv.ATTEMPT_SPANS_LOST] == 1
    assert [s.name for s in await store.query_spans(queued.rollout_id)] == [semconv.SPAN_REWARD]
    assert f"1 span(s) of rollout {queued.rollout_id}" in caplog.text
