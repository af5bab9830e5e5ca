"""SqliteStore shared by several processes on one file, and killed mid-write.

Real processes, a real file: four claimer processes drain one queue and each rollout is claimed
exactly once; a writer killed with SIGKILL loses none of the writes it had acknowledged (span adds,
attempt updates, resources, enqueues).
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
from fulgor.types import PromptTemplate, RolloutConfig, RolloutRequest

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

# Each kind of write in turn, printing one line once the store has acknowledged it.
WRITER = """
import asyncio, sys
from fulgor.store import SqliteStore
from fulgor.types import PromptTemplate, RolloutRequest, Span

async def main(path, rollout_id, attempt_id):
    store = SqliteStore(path)
    i = 0
    while True:
        i += 1
        span = Span(rollout_id=rollout_id, attempt_id=attempt_id, trace_id="t", span_id=f"s{i}",
                    name="fulgor.message", start_time=float(i), attributes={"i": i})
        await store.add_spans([span])
        print(f"span s{i}", flush=True)
        await store.update_attempt(rollout_id, attempt_id, metadata={f"m{i}": i})
        print(f"metadata m{i}", flush=True)
        version = await store.put_resources({"prompt": PromptTemplate(template=f"v{i} {{x}}")})
        print(f"resources {version.resources_id}", flush=True)
        [rollout] = await store.enqueue([RolloutRequest(input=i)])
        print(f"rollout {rollout.rollout_id}", flush=True)
        [claimed] = await store.claim("writer")
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
        print(f"succeeded {claimed.rollout_id}", flush=True)

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


def test_sigkill_loses_no_acknowledged_write_and_the_attempt_goes_unresponsive(tmp_path: Path) -> None:
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
    acknowledged: dict[str, list[str]] = {}
    lines = 0
    deadline = time.monotonic() + 60
    # 503 lines: killed in the middle of its 101st round (one write of each kind is 5 lines).
    while lines < 503 and time.monotonic() < deadline:
        kind, value = writer.stdout.readline().split()
        acknowledged.setdefault(kind, []).append(value)
        lines += 1
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    writer.stdout.close()
    assert lines == 503
    assert {kind: len(values) for kind, values in acknowledged.items()} == {
        "span": 101, "metadata": 101, "resources": 101, "rollout": 100, "succeeded": 100
    }  # fmt: skip

    async def check() -> None:
        store = SqliteStore(path)
        spans = await store.query_spans(rollout_id, attempt_id)
        assert set(acknowledged["span"]) <= {span.span_id for span in spans}
        sequence = [span.sequence_id for span in spans]
        assert sequence == list(range(1, len(spans) + 1))
        [attempt] = await store.list_attempts(rollout_id)
        assert set(acknowledged["metadata"]) <= set(attempt.metadata)
        for number, resources_id in enumerate(acknowledged["resources"], start=1):
            version = await store.get_resources(resources_id)
            assert version is not None
            assert version.resources["prompt"] == PromptTemplate(template=f"v{number} {{x}}")
        rollouts = await store.query_rollouts()
        enqueued = {r.rollout_id: r.status for r in rollouts if r.rollout_id != rollout_id}
        assert set(acknowledged["rollout"]) <= set(enqueued)
        assert {enqueued[r] for r in acknowledged["succeeded"]} == {"succeeded"}
        # A rollout the writer enqueued but had not yet claimed would be claimed before the retry.
        await store.cancel([r for r, status in enqueued.items() if status == "queuing"])
        # Nobody speaks for the killed writer's attempt any more: the watchdog retries the rollout.
        [retry] = await store.claim("survivor", wait_seconds=5)
        assert retry.rollout_id == rollout_id
        assert retry.attempt.sequence_id == 2
        [first, _] = await store.list_attempts(rollout_id)
        assert first.status == "unresponsive"
        await store.close()

    asyncio.run(check())
