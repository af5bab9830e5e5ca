"""PostgresStore shared by several processes: exactly-once claims and wake-ups through LISTEN/NOTIFY.

Real processes on one PostgreSQL schema. Claimers racing for one queue each get different
rollouts; a claim or wait sleeping in one process wakes as soon as another process changes what
it waits for, well before its own wait would end.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pgtools import postgres_url, schema_for

from fulgor.store.postgres import PostgresStore
from fulgor.types import RolloutConfig, RolloutRequest

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

CLAIMER = """
import asyncio, json, sys
from fulgor.store.postgres import PostgresStore

async def main(url, schema, worker_id):
    store = PostgresStore(url, schema=schema)
    await store.open()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # every claimer starts at once
    claimed = []
    while batch := await store.claim(worker_id, limit=3, wait_seconds=0.5):
        for item in batch:
            await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")
            claimed.append(item.rollout_id)
    await store.close()
    print(json.dumps(claimed), flush=True)

asyncio.run(main(*sys.argv[1:]))
"""

WAITER = """
import asyncio, json, sys, time
from fulgor.store.postgres import PostgresStore

async def main(url, schema, operation, argument):
    store = PostgresStore(url, schema=schema)
    await store.open()
    print("ready", flush=True)
    started = time.time()
    if operation == "claim":
        rollouts = await store.claim("far", wait_seconds=float(argument))
    else:
        rollouts = await store.wait([argument], timeout_seconds=30)
    result = {"started": started, "ended": time.time(), "rollouts": [r.rollout_id for r in rollouts]}
    await store.close()
    print(json.dumps(result), flush=True)

asyncio.run(main(*sys.argv[1:]))
"""

# A sleeper must be asleep before the change it waits for; it wakes "at once" when it returns
# within WAKE_SECONDS of the change (here typically 5-25 ms), while its own wait is 30 s.
SETTLE_SECONDS = 0.5
WAKE_SECONDS = 2.0


@pytest.fixture
def url() -> str:
    return postgres_url()


@pytest.fixture
def schema(url: str, tmp_path: Path) -> str:
    return schema_for(tmp_path, url)


@pytest.fixture
async def store(url: str, schema: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(url, schema=schema)
    await opened.open()
    yield opened
    await opened.close()


async def _start(script: str, *args: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), timeout=60) == b"ready\n"
    return process


async def _result(process: asyncio.subprocess.Process) -> Any:
    out, _ = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0
    return json.loads(out)


async def test_claimer_processes_take_each_rollout_exactly_once(
    url: str, schema: str, store: PostgresStore
) -> None:
    created = await store.enqueue([RolloutRequest(input=i) for i in range(600)])
    claimers = await asyncio.gather(*(_start(CLAIMER, url, schema, f"w{i}") for i in range(4)))
    for claimer in claimers:
        assert claimer.stdin is not None
        claimer.stdin.write(b"go\n")

    results = await asyncio.gather(*(_result(claimer) for claimer in claimers))

    claimed = [rollout_id for result in results for rollout_id in result]
    assert sorted(claimed) == sorted(rollout.rollout_id for rollout in created)
    assert all(results), "every claimer got a share of the queue"
    stats = await store.stats()
    assert (stats.rollouts, stats.attempts) == ({"succeeded": 600}, {"succeeded": 600})


async def test_a_claim_waiting_in_another_process_wakes_on_enqueue(
    url: str, schema: str, store: PostgresStore
) -> None:
    waiter = await _start(WAITER, url, schema, "claim", "30")
    await asyncio.sleep(SETTLE_SECONDS)

    (rollout,) = await store.enqueue([RolloutRequest(input="task")])
    enqueued = time.time()
    result = await _result(waiter)

    assert result["rollouts"] == [rollout.rollout_id]
    assert enqueued - result["started"] >= SETTLE_SECONDS / 2, "the claim was asleep before the enqueue"
    assert result["ended"] - enqueued < WAKE_SECONDS, "it woke on the notification, not after its wait"


async def test_a_wait_in_another_process_wakes_when_the_rollout_ends(
    url: str, schema: str, store: PostgresStore
) -> None:
    (rollout,) = await store.enqueue([RolloutRequest(input="task")])
    (claimed,) = await store.claim("near")
    waiter = await _start(WAITER, url, schema, "wait", rollout.rollout_id)
    await asyncio.sleep(SETTLE_SECONDS)

    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    ended = time.time()
    result = await _result(waiter)

    assert result["rollouts"] == [rollout.rollout_id]
    assert result["ended"] - ended < WAKE_SECONDS


async def test_a_timeout_started_in_another_process_wakes_a_waiting_claim(
    url: str, schema: str, store: PostgresStore
) -> None:
    waiter = await _start(WAITER, url, schema, "claim", "30")
    await asyncio.sleep(SETTLE_SECONDS)

    # Skips the queue, so only the new attempt's deadline can tell the sleeper when to look again.
    request = RolloutRequest(input="task", config=RolloutConfig(timeout_seconds=1.0, max_attempts=2))
    started = await store.start_rollout(request, "near")
    began = time.time()
    result = await _result(waiter)

    assert result["rollouts"] == [started.rollout_id]
    assert 1.0 - 0.1 <= result["ended"] - began < 1.0 + WAKE_SECONDS
    first, second = await store.list_attempts(started.rollout_id)
    assert (first.status, second.worker_id) == ("timeout", "far")


async def test_waiters_wake_after_the_listen_connection_is_cut(url: str, schema: str) -> None:
    sleeper, writer = PostgresStore(url, schema=schema), PostgresStore(url, schema=schema)
    await sleeper.open()
    await writer.open()
    try:
        cut = await _terminate_listeners(url, schema)
        assert cut == 2
        await asyncio.sleep(1.0)  # the first reconnect comes after 0.1 s

        claim = asyncio.ensure_future(sleeper.claim("far", wait_seconds=30))
        await asyncio.sleep(SETTLE_SECONDS)
        (rollout,) = await writer.enqueue([RolloutRequest(input="task")])
        enqueued = time.monotonic()
        claimed = await asyncio.wait_for(claim, timeout=30)

        assert [c.rollout_id for c in claimed] == [rollout.rollout_id]
        assert time.monotonic() - enqueued < WAKE_SECONDS
    finally:
        await sleeper.close()
        await writer.close()


async def _terminate_listeners(url: str, schema: str) -> int:
    """End the server sessions listening on the schema's channel; returns how many."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
            (f'LISTEN "fulgor_{schema}"',),
        )
        return len(await cursor.fetchall())
