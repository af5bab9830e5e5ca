"""The dashboard's readers: the SQLite one (indexed SQL, read-only) and the one over any store agree,
and the SQLite store keeps the rewards and agents they filter by, also for a store from before."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fulgor.dashboard.reader import RolloutQuery, SqliteReader, StoreReader
from fulgor.errors import ConfigError, NotFoundError, ValidationError
from fulgor.store.memory import MemoryStore
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.rollouts import write_rollouts

QUERIES = [
    RolloutQuery(),
    RolloutQuery(sort="oldest", limit=7, offset=7),
    RolloutQuery(status=("failed",)),
    RolloutQuery(mode="val"),
    RolloutQuery(group_id="step-2-group-5"),
    RolloutQuery(step=3),
    RolloutQuery(agent="checker"),
    RolloutQuery(agent="nobody"),
    RolloutQuery(reward_min=0.5),
    RolloutQuery(reward_min=0.2, reward_max=0.6, sort="reward_desc"),
    RolloutQuery(sort="reward_asc", limit=5),
    RolloutQuery(attempt_status="failed"),
    RolloutQuery(step=2, agent="writer", status=("succeeded",)),
]


@pytest.fixture
async def stores(tmp_path: Path) -> tuple[SqliteReader, StoreReader]:
    """The same 60 rollouts (every 7th failed) in a SQLite store and a memory store."""
    sqlite = SqliteStore(tmp_path / "store.sqlite")
    memory = MemoryStore()
    for store in (sqlite, memory):
        await write_rollouts(store, 60, failed_every=7, rollouts_per_step=16, batch=25)
    await sqlite.close()
    return SqliteReader(tmp_path / "store.sqlite"), StoreReader(memory)


def summary(page: object) -> list[tuple[object, ...]]:
    rows = page.rows  # type: ignore[attr-defined]
    return [(r.rollout.input["index"], r.rollout.status, r.reward) for r in rows]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: repr(q)[12:60])
async def test_both_readers_give_the_same_page(
    stores: tuple[SqliteReader, StoreReader], query: RolloutQuery
) -> None:
    sqlite, generic = stores
    indexed, scanned = await sqlite.rollouts(query), await generic.rollouts(query)
    assert summary(indexed) == summary(scanned)
    assert indexed.total == scanned.total


async def test_filters_select_what_they_name(stores: tuple[SqliteReader, StoreReader]) -> None:
    sqlite, _ = stores
    everything = await sqlite.rollouts(RolloutQuery(limit=500))
    assert everything.total == 60
    assert [r.rollout.input["index"] for r in everything.rows] == list(range(59, -1, -1))  # newest first
    failed = await sqlite.rollouts(RolloutQuery(status=("failed",), limit=500))
    assert {r.rollout.input["index"] for r in failed.rows} == {i for i in range(60) if i % 7 == 6}
    step = await sqlite.rollouts(RolloutQuery(step=2, limit=500))
    assert {r.rollout.input["index"] for r in step.rows} == set(range(16, 32))
    agent = await sqlite.rollouts(RolloutQuery(agent="checker", limit=500))
    assert {r.rollout.input["index"] for r in agent.rows} == set(range(1, 60, 2))
    rewarded = await sqlite.rollouts(RolloutQuery(reward_min=0.5, sort="reward_desc", limit=500))
    rewards = [r.reward for r in rewarded.rows]
    assert rewards == sorted(rewards, reverse=True)
    assert rewards
    assert all(reward is not None and reward >= 0.5 for reward in rewards)
    longest = await sqlite.rollouts(RolloutQuery(sort="duration_desc", limit=500))
    durations = [r.rollout.end_time - r.rollout.start_time for r in longest.rows]  # type: ignore[operator]
    assert len(durations) == 60
    assert durations == sorted(durations, reverse=True)
    page_two = await sqlite.rollouts(RolloutQuery(limit=25, offset=25))
    assert [r.rollout.input["index"] for r in page_two.rows] == list(range(34, 9, -1))
    assert await sqlite.agents() == ["checker", "writer"]


async def test_the_reader_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = SqliteStore(path)
    ids = await write_rollouts(store, 5)
    await store.close()
    before = path.read_bytes()
    reader = SqliteReader(path)
    assert (await reader.get_rollout(ids[0])).rollout_id == ids[0]
    assert len(await reader.query_spans(ids[0])) == 3 + 4  # three calls
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._conn.execute("DELETE FROM rollouts")
    await reader.close()
    assert path.read_bytes() == before


async def test_unknown_ids_and_bad_queries_say_what_to_do(
    stores: tuple[SqliteReader, StoreReader], tmp_path: Path
) -> None:
    sqlite, _ = stores
    with pytest.raises(NotFoundError, match="ro-nothing"):
        await sqlite.get_rollout("ro-nothing")
    with pytest.raises(ValidationError, match="sort must be one of"):
        RolloutQuery(sort="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="above reward_max"):
        RolloutQuery(reward_min=1, reward_max=0)
    with pytest.raises(ConfigError, match="no store at"):
        SqliteReader(tmp_path / "missing.sqlite")
    (tmp_path / "other.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match="fulgor store"):
        SqliteReader(tmp_path / "other.sqlite")


async def test_a_store_from_before_the_indexes_is_indexed_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = SqliteStore(path)
    await write_rollouts(store, 20)
    await store.close()
    expected = (
        await _page(path, RolloutQuery(agent="writer", reward_min=0.3, limit=500)),
        await SqliteReader(path).agents(),
    )
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE rollout_rewards; DROP TABLE rollout_agents; PRAGMA user_version = 0;")
    conn.close()
    with pytest.raises(ConfigError, match="older fulgor"):
        SqliteReader(path)
    await SqliteStore(path).close()  # opening it with this version fills both tables from its spans
    assert (
        await _page(path, RolloutQuery(agent="writer", reward_min=0.3, limit=500)),
        await SqliteReader(path).agents(),
    ) == expected
    assert expected[0]


async def _page(path: Path, query: RolloutQuery) -> list[tuple[object, ...]]:
    reader = SqliteReader(path)
    try:
        return summary(await reader.rollouts(query))
    finally:
        await reader.close()


async def test_workers_list_their_live_attempts(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.sqlite")
    await write_rollouts(store, 3)
    from fulgor.types import RolloutRequest

    (rollout,) = await store.enqueue([RolloutRequest(input="live one")])
    (claimed,) = await store.claim("worker-b")
    await store.heartbeat("worker-b", stats={"busy": 1})
    await store.close()
    workers = await SqliteReader(tmp_path / "store.sqlite").workers()
    by_name = {worker.worker_id: [a.rollout_id for a in live] for worker, live in workers}
    assert by_name == {"synthetic-worker": [], "worker-b": [rollout.rollout_id]}
    assert claimed.rollout_id == rollout.rollout_id


async def test_a_reader_that_scans_says_how_far_it_read(
    stores: tuple[SqliteReader, StoreReader], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fulgor.dashboard import reader

    _, generic = stores
    monkeypatch.setattr(reader, "SCAN_LIMIT", 10)
    scanned = await generic.rollouts(RolloutQuery(agent="writer"))
    assert scanned.scanned == 10
    assert [r.rollout.input["index"] for r in scanned.rows] == [58, 56, 54, 52, 50]  # of the newest 10
    plain = await generic.rollouts(RolloutQuery(status=("succeeded",)))
    assert plain.scanned is None  # the store filters by status itself, and counts from stats()
    assert plain.total == len([i for i in range(60) if i % 7 != 6])
    by_mode = await generic.rollouts(RolloutQuery(mode="train", limit=5))
    assert (len(by_mode.rows), by_mode.total, by_mode.scanned) == (5, 10, 10)  # counted up to the limit
