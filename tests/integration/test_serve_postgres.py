"""Two ``fulgor serve`` processes on one PostgreSQL database share the work correctly.

Eight claimers, four on each server, wait on an empty queue; 2,000 rollouts are enqueued through
one server. Claimers on the other server wake through LISTEN/NOTIFY, every rollout is claimed
exactly once, and all of them finish.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from fulgor.store.client import StoreClient
from fulgor.types import RolloutRequest

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

ROLLOUTS = 2000
CLAIMERS_PER_SERVER = 4


@dataclass
class Claimer:
    client: StoreClient
    worker_id: str
    claimed: list[tuple[str, int]] = field(default_factory=list)  # (rollout_id, attempt sequence_id)


@pytest.fixture
def store_url() -> Iterator[str]:
    """A fresh schema on the test server, dropped afterwards."""
    url = os.environ.get("FULGOR_TEST_POSTGRES_URL")
    if not url:
        pytest.skip('FULGOR_TEST_POSTGRES_URL is not set; `eval "$(bash .ci/start-postgres.sh)"` sets it')
    schema = f"test_serve_{uuid.uuid4().hex[:12]}"
    yield f"{url}{'&' if '?' in url else '?'}schema={schema}"
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def servers(store_url: str) -> Iterator[list[str]]:
    """Two ``fulgor serve`` processes on the same store; their URLs."""
    env = {key: value for key, value in os.environ.items() if key != "FULGOR_TOKEN"}
    command = [sys.executable, "-m", "fulgor.cli.main", "serve", "--store", store_url, "--port", "0"]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        urls = []
        for process in processes:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line.startswith("http://"), f"fulgor serve printed {line!r} instead of its URL"
            urls.append(line)
        yield urls
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


async def _drain(claimer: Claimer, enqueued: asyncio.Event) -> None:
    """Claim one rollout at a time and finish it, until the queue stays empty after the enqueue."""
    while True:
        batch = await claimer.client.claim(claimer.worker_id, limit=1, wait_seconds=2)
        if not batch:
            if enqueued.is_set():
                return
            continue
        for item in batch:
            claimer.claimed.append((item.rollout_id, item.attempt.sequence_id))
            await claimer.client.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")


async def test_two_servers_on_one_database_claim_each_rollout_exactly_once(servers: list[str]) -> None:
    claimers = [
        Claimer(StoreClient(url), f"s{server}-w{i}")
        for server, url in enumerate(servers)
        for i in range(CLAIMERS_PER_SERVER)
    ]
    front, back = StoreClient(servers[0]), StoreClient(servers[1])
    enqueued = asyncio.Event()
    try:
        draining = [asyncio.ensure_future(_drain(claimer, enqueued)) for claimer in claimers]
        await asyncio.sleep(0.5)  # every claimer is now asleep on the empty queue
        created = []
        for start in range(0, ROLLOUTS, 500):
            created += await front.enqueue(
                [RolloutRequest(input={"n": n}) for n in range(start, start + 500)]
            )
        enqueued.set()
        await asyncio.wait_for(asyncio.gather(*draining), timeout=180)

        claimed = [entry for claimer in claimers for entry in claimer.claimed]
        assert sorted(rollout_id for rollout_id, _ in claimed) == sorted(r.rollout_id for r in created)
        assert {sequence_id for _, sequence_id in claimed} == {1}, "no rollout needed a second attempt"
        per_server = [
            sum(len(c.claimed) for c in claimers if c.worker_id.startswith(f"s{s}-")) for s in (0, 1)
        ]
        assert all(per_server), f"both servers must hand out work, got {per_server}"

        done = await back.wait([r.rollout_id for r in created], timeout_seconds=30)
        assert len(done) == ROLLOUTS
        assert {r.status for r in done} == {"succeeded"}
        stats = await back.stats()
        assert (stats.rollouts, stats.attempts) == ({"succeeded": ROLLOUTS}, {"succeeded": ROLLOUTS})
    finally:
        for client in [front, back, *(claimer.client for claimer in claimers)]:
            await client.close()
