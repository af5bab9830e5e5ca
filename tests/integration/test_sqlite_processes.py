"""SqliteStore shared by several processes on one file, and killed mid-write.

Real processes, a real file: four claimer processes drain one queue and each rollout is claimed
exactly once; a writer killed with SIGKILL loses none of the span adds it had acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fulgor.store import SqliteStore
from fulgor.types import RolloutConfig, RolloutRequest

CLAIMER = """
import asyncio, json, sys
from fulgor.store import SqliteStore

async def main(path, worker_id):
    store = SqliteStore(path)
    claimed = []
    while True:
        batch = await store.claim(worker_id, limit=2, wait_seconds=0.5)
        if not batch:
            break
        for item in batch:
            await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")
            claimed.append(item.rollout_id)
    await store.close()
    print(json.dumps(claimed))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

WRITER = """
import asyncio, sys
from fulgor.store import SqliteStore
from fulgor.types import Span

async def main(path, rollout_id, attempt_id):
    store = SqliteStore(path)
    i = 0
    while True:
        i += 1
        span = Span(rollout_id=rollout_id, attempt_id=attempt_id, trace_id="t", span_id=f"s{i}",
                    name="fulgor.message", start_time=float(i), attributes={"i": i})
        await store.add_spans([span])
        print(f"ack s{i}", flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


def test_processes_claim_each_rollout_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"

    async def enqueue() -> list[str]:
        store = SqliteStore(path)
        rollouts = await store.enqueue([RolloutRequest(input=i) for i in range(200)])
        await store.close()
        return [rollout.rollout_id for rollout in rollouts]

    expected = asyncio.run(enqueue())
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(path), f"w{i}"], stdout=subprocess.PIPE, text=True
        )
        for i in range(4)
    ]
    claimed: list[str] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        claimed.extend(json.loads(out))
    assert sorted(claimed) == sorted(expected)
    assert len(set(claimed)) == len(claimed)

    async def check() -> None:
        store = SqliteStore(path)
        stats = await store.stats()
        assert stats.rollouts == {"succeeded": 200}
        assert stats.attempts == {"succeeded": 200}
        await store.close()

    asyncio.run(check())


def test_sigkill_loses_no_acknowledged_span_and_the_attempt_goes_unresponsive(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"

    async def start() -> tuple[str, str]:
        store = SqliteStore(path)
        config = RolloutConfig(unresponsive_seconds=0.5, max_attempts=2)
        await store.enqueue([RolloutRequest(input="task", config=config)])
        [claimed] = await store.claim("writer")
        await store.close()
        return claimed.rollout_id, claimed.attempt.attempt_id

    rollout_id, attempt_id = asyncio.run(start())
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), rollout_id, attempt_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    acknowledged = []
    deadline = time.monotonic() + 60
    while len(acknowledged) < 200 and time.monotonic() < deadline:
        acknowledged.append(writer.stdout.readline().split()[1])
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    writer.stdout.close()
    assert len(acknowledged) == 200

    async def check() -> None:
        store = SqliteStore(path)
        spans = await store.query_spans(rollout_id, attempt_id)
        stored_ids = {span.span_id for span in spans}
        assert set(acknowledged) <= stored_ids
        sequence = [span.sequence_id for span in spans]
        assert sequence == list(range(1, len(spans) + 1))
        # Nobody speaks for the killed writer's attempt any more: the watchdog retries the rollout.
        [retry] = await store.claim("survivor", wait_seconds=5)
        assert retry.rollout_id == rollout_id
        assert retry.attempt.sequence_id == 2
        [first, _] = await store.list_attempts(rollout_id)
        assert first.status == "unresponsive"
        await store.close()

    asyncio.run(check())
