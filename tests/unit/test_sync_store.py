"""SyncStore mirrors the async operations as blocking calls; open_store builds stores from URLs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fulgor.errors import ConfigError, NotFoundError
from fulgor.store import MemoryStore, SqliteStore, Store, SyncStore, open_store
from fulgor.types import LLM, RolloutRequest, Span


def test_sync_store_round_trip(tmp_path: Path) -> None:
    with SyncStore(SqliteStore(tmp_path / "s.sqlite")) as store:
        [rollout] = store.enqueue([RolloutRequest(input={"q": 1})])
        store.put_resources({"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})
        [claimed] = store.claim("w1")
        assert claimed.rollout_id == rollout.rollout_id
        span = Span(
            rollout_id=claimed.rollout_id,
            attempt_id=claimed.attempt.attempt_id,
            trace_id="t",
            span_id="s",
            name="fulgor.reward",
            start_time=1.0,
        )
        [stored] = store.add_spans([span])
        assert stored.sequence_id == 1
        store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
        [done] = store.wait([rollout.rollout_id], timeout_seconds=5)
        assert done.status == "succeeded"
        assert done.resources_id == "resources-1"
        assert store.stats().spans == 1
        with pytest.raises(NotFoundError):
            store.get_rollout("missing")


def test_sync_claim_waits_for_an_enqueue_from_another_thread() -> None:
    with SyncStore(MemoryStore()) as store:
        timer = threading.Timer(0.1, lambda: store.enqueue([RolloutRequest(input=1)]))
        timer.start()
        claimed = store.claim("w", wait_seconds=10)
        timer.join()
        assert len(claimed) == 1


def test_open_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    sqlite = open_store(f"sqlite:///{tmp_path}/run/store.sqlite")
    assert isinstance(sqlite, SqliteStore)
    assert isinstance(sqlite, Store)
    assert (tmp_path / "run" / "store.sqlite").exists()
    with pytest.raises(ConfigError, match="memory://"):
        open_store("mongodb://x")
    with pytest.raises(ConfigError, match="no store at"):
        open_store(f"sqlite:///{tmp_path}/missing.sqlite", create=False)
