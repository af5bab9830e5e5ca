"""Crash safety: ``fulgor serve`` killed with SIGKILL while clients add spans, then restarted.

Every span whose add was acknowledged must be in the store afterwards; clients ride out the
restart through their retries; the attempts that were running go unresponsive and are retried,
so no rollout stays stuck.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from fulgor.store.client import StoreClient
from fulgor.types import AttemptedRollout, RolloutConfig, RolloutRequest, Span

SERVE = (sys.executable, "-m", "fulgor.cli.main", "serve")


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([*SERVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    assert url, process.stderr.read() if process.stderr else "no URL printed"
    return process, url


async def keep_adding(
    client: StoreClient, item: AttemptedRollout, acked: set[tuple[str, str]], stop: asyncio.Event
) -> None:
    """Add one span per call until stopped; remember each span once its add is acknowledged."""
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
        acked.add((item.attempt.attempt_id, span.span_id))


async def test_sigkill_loses_no_acknowledged_span_and_strands_no_rollout(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/store.sqlite"
    process, url = await asyncio.to_thread(start, "--port", "0", "--store", store_url)
    port = url.rsplit(":", 1)[1]
    client = StoreClient(url, max_retries=60, backoff_max_seconds=0.25)
    restarted: subprocess.Popen[str] | None = None
    try:
        config = RolloutConfig(unresponsive_seconds=2, max_attempts=2)
        created = await client.enqueue([RolloutRequest(input=i, config=config) for i in range(4)])
        claimed = await client.claim("worker-before", limit=4)
        acked: set[tuple[str, str]] = set()
        stop = asyncio.Event()
        writers = [asyncio.ensure_future(keep_adding(client, item, acked, stop)) for item in claimed]
        await asyncio.sleep(1.0)

        os.kill(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait, 10)
        acked_before_restart = len(acked)
        restarted, _ = await asyncio.to_thread(start, "--port", port, "--store", store_url)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*writers)

        stored = {
            (span.attempt_id, span.span_id)
            for item in claimed
            for span in await client.query_spans(item.rollout_id)
        }
        assert acked_before_restart > 0
        assert len(acked) > acked_before_restart, "writers should carry on after the restart"
        assert acked <= stored

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
