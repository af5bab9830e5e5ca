"""Random operation sequences against every store backend, checked against a small model.

The model is the contract of :mod:`fulgor.store.base` written as plain data; after every step the
store must agree with it, and with itself (stats against queries). Persistent backends also get a
``reopen`` step: close the store, open a new one on the same files, and everything acknowledged
must still be there.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from storetools import BACKENDS, PERSISTENT, FakeClock

from fulgor.errors import InvalidTransitionError
from fulgor.store.base import Store
from fulgor.types import PromptTemplate, RolloutConfig, RolloutRequest, Span

T = TypeVar("T")

WORKERS = ("w1", "w2")
ATTEMPT_STATUSES = ("preparing", "running", "succeeded", "failed", "timeout", "unresponsive")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
CONFIGS = (
    RolloutConfig(),
    RolloutConfig(max_attempts=3),
    RolloutConfig(max_attempts=2, retry_on=("timeout",)),
    RolloutConfig(max_attempts=3, timeout_seconds=30),
    RolloutConfig(max_attempts=2, unresponsive_seconds=10),
    RolloutConfig(
        max_attempts=3, timeout_seconds=25, unresponsive_seconds=10, retry_on=("unresponsive", "failed")
    ),
)


@dataclass
class ModelAttempt:
    attempt_id: str
    worker_id: str
    status: str
    start_time: float
    last_active_time: float
    spans: dict[str, tuple[int, str]] = field(default_factory=dict)  # span_id -> (sequence_id, name)

    @property
    def live(self) -> bool:
        return self.status in ("preparing", "running")


@dataclass
class ModelRollout:
    rollout_id: str
    config: RolloutConfig
    status: str = "queuing"
    attempts: list[ModelAttempt] = field(default_factory=list)


class StoreMachine(RuleBasedStateMachine):
    """Drives one store through one event loop; ``backend`` and ``directory`` come from the test."""

    backend = "memory"
    directory = Path(".")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.store: Store = self.run(BACKENDS[self.backend](self.directory, self.clock))
        self.rollouts: dict[str, ModelRollout] = {}  # in creation order
        self.queue: list[list[str]] = []  # FIFO of groups; the order within a group is not specified
        self.workers: set[str] = set()  # surely known: sent a heartbeat or claimed work
        self.maybe_workers: set[str] = set()  # started attempts without claiming
        self.resources_versions = 0
        self.final: dict[str, str] = {}  # terminal statuses the store has reported
        self.span_numbers = itertools.count(1)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            self.loop.close()

    # -- model helpers ----------------------------------------------------------------------------

    def pick(self, index: int, *, with_attempts: bool = False) -> ModelRollout:
        choices = [r for r in self.rollouts.values() if r.attempts or not with_attempts]
        return choices[index % len(choices)]

    def dequeue(self, rollout_id: str) -> None:
        for group in self.queue:
            if rollout_id in group:
                group.remove(rollout_id)
        self.queue = [group for group in self.queue if group]

    def begin(self, rollout: ModelRollout, attempt_id: str, worker_id: str) -> None:
        now = self.clock.now
        rollout.attempts.append(ModelAttempt(attempt_id, worker_id, "preparing", now, now))
        rollout.status = "preparing"

    def end(self, rollout: ModelRollout, attempt: ModelAttempt, status: str) -> list[str]:
        """End a live attempt; returns the rollout id when it goes back to the queue."""
        attempt.status = status
        if attempt is not rollout.attempts[-1] or rollout.status in TERMINAL:
            return []
        if status == "succeeded":
            rollout.status = "succeeded"
        elif status in rollout.config.retry_on and len(rollout.attempts) < rollout.config.max_attempts:
            rollout.status = "requeuing"
            return [rollout.rollout_id]
        else:
            rollout.status = "failed"
        return []

    def overdue(self, rollout: ModelRollout, attempt: ModelAttempt) -> str | None:
        """The watchdog's verdict: whichever deadline passed first (timeout on a tie)."""
        config = rollout.config
        timeout_at = None if config.timeout_seconds is None else attempt.start_time + config.timeout_seconds
        silent_at = (
            None
            if config.unresponsive_seconds is None
            else attempt.last_active_time + config.unresponsive_seconds
        )
        deadlines = [d for d in (timeout_at, silent_at) if d is not None]
        if not deadlines or min(deadlines) > self.clock.now:
            return None
        return "timeout" if timeout_at is not None and timeout_at == min(deadlines) else "unresponsive"

    def sweep(self) -> None:
        requeued: list[str] = []
        for rollout in self.rollouts.values():
            if rollout.attempts and rollout.attempts[-1].live:
                verdict = self.overdue(rollout, rollout.attempts[-1])
                if verdict is not None:
                    requeued += self.end(rollout, rollout.attempts[-1], verdict)
        if requeued:
            self.queue.append(requeued)

    def check_claimed(self, claimed_ids: list[str], limit: int) -> None:
        """The claimed ids are the oldest queued ones, in queue order (any order within a group)."""
        queued = sum(len(group) for group in self.queue)
        assert len(claimed_ids) == min(limit, queued), (claimed_ids, self.queue)
        position = 0
        while position < len(claimed_ids):
            group = self.queue[0]
            chunk = claimed_ids[position : position + len(group)]
            assert set(chunk) <= set(group), f"claim broke FIFO: got {chunk}, queue front is {group}"
            assert len(set(chunk)) == len(chunk)
            for rollout_id in chunk:
                group.remove(rollout_id)
            if not group:
                self.queue.pop(0)
            position += len(chunk)

    # -- rules ------------------------------------------------------------------------------------

    @initialize(configs=st.lists(st.sampled_from(CONFIGS), min_size=1, max_size=3))
    def enqueue_first(self, configs: list[RolloutConfig]) -> None:
        self.enqueue(configs)

    @rule(configs=st.lists(st.sampled_from(CONFIGS), min_size=1, max_size=3))
    def enqueue(self, configs: list[RolloutConfig]) -> None:
        created = self.run(
            self.store.enqueue([RolloutRequest(input={"i": i}, config=c) for i, c in enumerate(configs)])
        )
        assert [r.status for r in created] == ["queuing"] * len(configs)
        for rollout, config in zip(created, configs, strict=True):
            self.rollouts[rollout.rollout_id] = ModelRollout(rollout.rollout_id, config)
            self.queue.append([rollout.rollout_id])

    @rule(config=st.sampled_from(CONFIGS), worker=st.sampled_from(WORKERS))
    def start_rollout(self, config: RolloutConfig, worker: str) -> None:
        started = self.run(self.store.start_rollout(RolloutRequest(input={}, config=config), worker))
        rollout = self.rollouts[started.rollout_id] = ModelRollout(started.rollout_id, config)
        self.begin(rollout, started.attempt.attempt_id, worker)
        self.maybe_workers.add(worker)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim(self, worker: str, limit: int) -> None:
        claimed = self.run(self.store.claim(worker, limit=limit))
        self.check_claimed([c.rollout_id for c in claimed], limit)
        for item in claimed:
            rollout = self.rollouts[item.rollout_id]
            self.begin(rollout, item.attempt.attempt_id, worker)
            assert (item.attempt.sequence_id, item.attempt_count) == (
                len(rollout.attempts),
                len(rollout.attempts),
            )
        if claimed:
            self.workers.add(worker)

    @precondition(lambda self: self.rollouts)
    @rule(index=st.integers(0, 100), worker=st.sampled_from(WORKERS))
    def start_attempt(self, index: int, worker: str) -> None:
        rollout = self.pick(index)
        if rollout.status not in ("queuing", "requeuing"):
            with pytest.raises(InvalidTransitionError) as raised:
                self.run(self.store.start_attempt(rollout.rollout_id, worker))
            assert raised.value.from_status == rollout.status
            return
        started = self.run(self.store.start_attempt(rollout.rollout_id, worker))
        self.dequeue(rollout.rollout_id)
        self.begin(rollout, started.attempt.attempt_id, worker)
        self.maybe_workers.add(worker)

    @precondition(lambda self: any(r.attempts for r in self.rollouts.values()))
    @rule(index=st.integers(0, 100), which=st.integers(0, 3), status=st.sampled_from(ATTEMPT_STATUSES))
    def update_attempt(self, index: int, which: int, status: str) -> None:
        rollout = self.pick(index, with_attempts=True)
        attempt = rollout.attempts[-1 - which % len(rollout.attempts)]
        allowed = attempt.live and not (attempt.status == "running" and status == "preparing")
        call = self.store.update_attempt(rollout.rollout_id, attempt.attempt_id, status=status)  # type: ignore[arg-type]
        if not allowed:
            with pytest.raises(InvalidTransitionError) as raised:
                self.run(call)
            assert (raised.value.from_status, raised.value.to_status) == (attempt.status, status)
            return
        if status == attempt.status:  # a self-loop: the contract neither allows nor forbids it
            try:
                self.run(call)
            except InvalidTransitionError:
                return
        else:
            assert self.run(call).status == status
        attempt.last_active_time = self.clock.now
        if status in ("preparing", "running"):
            attempt.status = status
            rollout.status = status
        elif requeued := self.end(rollout, attempt, status):
            self.queue.append(requeued)

    @precondition(lambda self: any(r.attempts for r in self.rollouts.values()))
    @rule(
        picks=st.lists(
            st.tuples(st.integers(0, 100), st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=3
        )
    )
    def add_spans(self, picks: list[tuple[int, int, int]]) -> None:
        spans, expected, touched = [], [], []
        for index, which, readd in picks:
            rollout = self.pick(index, with_attempts=True)
            attempt = rollout.attempts[-1 - which % len(rollout.attempts)]
            known = list(attempt.spans)
            span_id = known[readd % len(known)] if readd and known else f"s{next(self.span_numbers)}"
            name = "a" if readd % 2 else "b"
            spans.append(
                Span(
                    rollout_id=rollout.rollout_id,
                    attempt_id=attempt.attempt_id,
                    trace_id="t",
                    span_id=span_id,
                    name=name,
                    start_time=self.clock.now,
                )
            )
            if span_id not in attempt.spans:
                attempt.spans[span_id] = (len(attempt.spans) + 1, name)
            expected.append((span_id, *attempt.spans[span_id]))
            touched.append((rollout, attempt))

        stored = self.run(self.store.add_spans(spans))

        assert [(s.span_id, s.sequence_id, s.name) for s in stored] == expected
        for rollout, attempt in touched:
            if attempt.live:
                attempt.status = rollout.status = "running"
                attempt.last_active_time = self.clock.now

    @rule(worker=st.sampled_from(WORKERS), named=st.none() | st.lists(st.integers(0, 100), max_size=3))
    def heartbeat(self, worker: str, named: list[int] | None) -> None:
        attempts = [attempt for rollout in self.rollouts.values() for attempt in rollout.attempts]
        attempt_ids = None
        if named is not None:  # any attempts, live or not, this worker's or not: only its live ones count
            attempt_ids = [attempts[i % len(attempts)].attempt_id for i in named] if attempts else []
        self.run(self.store.heartbeat(worker, {"n": 1}, attempt_ids))
        self.workers.add(worker)
        for attempt in attempts:
            refreshed = attempt_ids is None or attempt.attempt_id in attempt_ids
            if attempt.live and attempt.worker_id == worker and refreshed:
                attempt.last_active_time = self.clock.now

    @precondition(lambda self: self.rollouts)
    @rule(indices=st.lists(st.integers(0, 100), min_size=1, max_size=2))
    def cancel(self, indices: list[int]) -> None:
        chosen = list({self.pick(i).rollout_id: self.pick(i) for i in indices}.values())
        ended = [r for r in chosen if r.status in ("succeeded", "failed")]
        if ended:
            with pytest.raises(InvalidTransitionError) as raised:
                self.run(self.store.cancel([r.rollout_id for r in chosen]))
            assert raised.value.from_status in {r.status for r in ended}
            return
        result = self.run(self.store.cancel([r.rollout_id for r in chosen]))
        assert [(r.rollout_id, r.status) for r in result] == [(r.rollout_id, "cancelled") for r in chosen]
        for rollout in chosen:
            if rollout.attempts and rollout.attempts[-1].live:
                rollout.attempts[-1].status = "failed"
            self.dequeue(rollout.rollout_id)
            rollout.status = "cancelled"

    @rule(seconds=st.sampled_from([1, 4, 9, 10, 26, 60]))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.sweep()

    @rule()
    def put_resources(self) -> None:
        stored = self.run(self.store.put_resources({"p": PromptTemplate(template="v")}))
        self.resources_versions += 1
        assert stored.version == self.resources_versions

    @precondition(lambda self: self.backend in PERSISTENT)
    @rule()
    def reopen(self) -> None:
        self.run(self.store.close())
        self.store = self.run(BACKENDS[self.backend](self.directory, self.clock))

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def store_agrees_with_the_model(self) -> None:
        rollouts = self.run(self.store.query_rollouts())
        assert [r.rollout_id for r in rollouts] == list(self.rollouts)
        for rollout in rollouts:
            model = self.rollouts[rollout.rollout_id]
            assert rollout.status == model.status, rollout.rollout_id
            assert rollout.attempt_count == len(model.attempts) <= model.config.max_attempts
            if rollout.status in TERMINAL:
                assert self.final.setdefault(rollout.rollout_id, rollout.status) == rollout.status
            attempts = self.run(self.store.list_attempts(rollout.rollout_id))
            assert [(a.attempt_id, a.status) for a in attempts] == [
                (a.attempt_id, a.status) for a in model.attempts
            ]
            assert [a.sequence_id for a in attempts] == list(range(1, len(attempts) + 1))
            assert all(not a.is_live for a in attempts[:-1]), "only the latest attempt may be live"
            self.check_spans(model)
        self.check_stats(rollouts)

    def check_spans(self, model: ModelRollout) -> None:
        spans = self.run(self.store.query_spans(model.rollout_id))
        for attempt in model.attempts:
            mine = [s for s in spans if s.attempt_id == attempt.attempt_id]
            assert [s.sequence_id for s in mine] == list(range(1, len(mine) + 1))
            assert {s.span_id: (s.sequence_id, s.name) for s in mine} == attempt.spans
        assert len(spans) == sum(len(a.spans) for a in model.attempts)

    def check_stats(self, rollouts: list[Any]) -> None:
        stats = self.run(self.store.stats())
        by_status: dict[str, int] = {}
        for rollout in rollouts:
            by_status[rollout.status] = by_status.get(rollout.status, 0) + 1
        assert {k: v for k, v in stats.rollouts.items() if v} == by_status
        attempts: dict[str, int] = {}
        for attempt in (a for r in self.rollouts.values() for a in r.attempts):
            attempts[attempt.status] = attempts.get(attempt.status, 0) + 1
        assert {k: v for k, v in stats.attempts.items() if v} == attempts
        assert stats.spans == sum(len(a.spans) for r in self.rollouts.values() for a in r.attempts)
        assert stats.resources_versions == self.resources_versions
        listed = {w.worker_id for w in self.run(self.store.list_workers())}
        assert self.workers <= listed <= self.workers | self.maybe_workers
        assert stats.workers == len(listed)


# Runs per backend, sized so the file stays well under a minute on two cores; backends reached over
# a network or a server round trip get fewer (their conformance suite covers the single operations).
EXAMPLES = {"memory": 100, "sqlite": 60}
EXAMPLES_OVER_THE_NETWORK = 10


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_store_state_machine(backend: str, tmp_path: Path) -> None:
    asyncio.run(_check_backend_available(backend, tmp_path))
    runs = itertools.count()

    class Machine(StoreMachine):
        def __init__(self) -> None:
            self.backend = backend
            self.directory = tmp_path / f"run-{next(runs)}"
            self.directory.mkdir()
            super().__init__()

    examples = EXAMPLES.get(backend, EXAMPLES_OVER_THE_NETWORK)
    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=examples, stateful_step_count=40, deadline=None, database=None),
    )


async def _check_backend_available(backend: str, directory: Path) -> None:
    """Skip (through the factory) a backend whose module is not written yet."""
    store = await BACKENDS[backend](directory, FakeClock())
    await store.close()
