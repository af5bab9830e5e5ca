"""Crash safety: ``fulgor serve`` killed with SIGKILL while clients add spans, then restarted.

Every write that was acknowledged (span adds, attempt updates, resources puts, enqueues) must be
in the store afterwards; clients ride out the restart through their retries; the attempts that
were running go unresponsive and are retried, so no rollout stays stuck.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fulgor.store.client import StoreClient
from fulgor.types import AttemptedRollout, PromptTemplate, RolloutConfig, RolloutRequest, Span

SERVE = (sys.executable, "-m", "fulgor.cli.main", "serve")


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([*SERVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    assert url, process.stderr.read() if process.stderr else "no URL printed"
    return process, url


@dataclass
class Acknowledged:
    """The writes the server has acknowledged, by kind."""

    spans: set[tuple[str, str]] = field(default_factory=set)  # (attempt id, span id)
    metadata: set[tuple[str, str]] = field(default_factory=set)  # (rollout id, metadata key)
    resources: dict[str, PromptTemplate] = field(default_factory=dict)  # by resources id
    rollouts: set[str] = field(default_factory=set)  # enqueued
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)  # after every round

    def count(self) -> int:
        return len(self.spans) + len(self.metadata) + len(self.resources) + len(self.rollouts)

    async def wait_for_rollouts(self, count: int) -> None:
        """Wait until ``count`` enqueues, each the last write of its round, are acknowledged."""
        async with asyncio.timeout(60), self.changed:
            await self.changed.wait_for(lambda: len(self.rollouts) >= count)


async def keep_writing(
    client: StoreClient, item: AttemptedRollout, acked: Acknowledged, stop: asyncio.Event
) -> None:
    """Each kind of write in turn until stopped; remember each one once it is acknowledged."""
    number = 0
    while not stop.is_set():
        number += 1
        span = Span(
            rollout_id=item.rollout_id,
            attempt_id=item.attempt.attempt_id,
            trace_id="t",
            span_id=f"s{number}",
            name="fulgor.message",
            start_time=float(number),
        )
        await client.add_spans([span])
        acked.spans.add((item.attempt.attempt_id, span.span_id))
        key = f"m{number}"
        await client.update_attempt(item.rollout_id, item.attempt.attempt_id, metadata={key: number})
        acked.metadata.add((item.rollout_id, key))
        prompt = PromptTemplate(template=f"{item.rollout_id} {number} {{x}}")
        version = await client.put_resources({"prompt": prompt})
        acked.resources[version.resources_id] = prompt
        [rollout] = await client.enqueue([RolloutRequest(input={"from": item.rollout_id, "number": number})])
        acked.rollouts.add(rollout.rollout_id)
        async with acked.changed:
            acked.changed.notify_all()


async def test_sigkill_loses_no_acknowledged_write_and_strands_no_rollout(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/store.sqlite"
    process, url = await asyncio.to_thread(start, "--port", "0", "--store", store_url)
    port = url.rsplit(":", 1)[1]
    client = StoreClient(url, max_retries=60, backoff_max_seconds=0.25)
    restarted: subprocess.Popen[str] | None = None
    try:
        config = RolloutConfig(unresponsive_seconds=2, max_attempts=2)
        created = await client.enqueue([RolloutRequest(input=i, config=config) for i in range(4)])
        claimed = await client.claim("worker-before", limit=4)
        acked = Acknowledged()
        stop = asyncio.Event()
        writers = [asyncio.ensure_future(keep_writing(client, item, acked, stop)) for item in claimed]
        # Killed once every kind of write has been acknowledged a few times.
        await acked.wait_for_rollouts(8)

        os.kill(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait, 10)
        acked_before_restart = acked.count()
        rollouts_before_restart = len(acked.rollouts)
        restarted, _ = await asyncio.to_thread(start, "--port", port, "--store", store_url)
        await acked.wait_for_rollouts(rollouts_before_restart + 8)
        stop.set()
        await asyncio.gather(*writers)

        assert acked_before_restart > 0
        assert acked.count() > acked_before_restart, "writers should carry on after the restart"
        stored_spans = {
            (span.attempt_id, span.span_id)
            for item in claimed
            for span in await client.query_spans(item.rollout_id)
        }
        assert acked.spans <= stored_spans
        stored_metadata = {
            (item.rollout_id, key)
            for item in claimed
            for key in (await client.list_attempts(item.rollout_id))[0].metadata
        }
        assert acked.metadata <= stored_metadata
        for resources_id, prompt in acked.resources.items():
            version = await client.get_resources(resources_id)
            assert version is not None
            assert version.resources["prompt"] == prompt
        enqueued = await client.query_rollouts(status="queuing")
        assert acked.rollouts <= {r.rollout_id for r in enqueued}
        # Out of the way of the retries below (a retried enqueue may have added a few more).
        await client.cancel([r.rollout_id for r in enqueued])

        # The old worker is gone: its attempts fall silent, go unresponsive and are requeued.
        retried: list[AttemptedRollout] = []
        async with asyncio.timeout(30):
            while len(retried) < len(created):
                retried += await client.claim("worker-after", limit=4, wait_seconds=20)
        assert {r.rollout_id for r in retried} == {r.rollout_id for r in created}
        assert {r.attempt.sequence_id for r in retried} == {2}
        for item in retried:
            attempts = await client.list_attempts(item.rollout_id)
            assert attempts[0].status == "unresponsive"
            await client.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")
        done = await client.wait([r.rollout_id for r in created], timeout_seconds=10)
        assert sorted(r.status for r in done) == ["succeeded"] * 4
    finally:
        await client.close()
        for running in (process, restarted):
            if running is not None and running.poll() is None:
                running.terminate()
                await asyncio.to_thread(running.wait, 15)
