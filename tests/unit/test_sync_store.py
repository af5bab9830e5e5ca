"""SyncStore mirrors the async operations as blocking calls; open_store builds stores from URLs."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from pathlib import Path

import pytest

from fulgor.errors import ConfigError, NotFoundError, ValidationError
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


def test_close_ends_the_calls_still_waiting_with_a_clear_error() -> None:
    store = SyncStore(MemoryStore())
    [rollout] = store.enqueue([RolloutRequest(input=1)])
    errors: list[BaseException] = []

    def blocked(call: str) -> None:
        try:
            if call == "wait":
                store.wait([rollout.rollout_id], 20)
            else:
                store.claim("w", wait_seconds=20)
        except BaseException as error:
            errors.append(error)

    store.claim("w0")  # the queue is empty: the next claim waits
    threads = [threading.Thread(target=blocked, args=(call,), daemon=True) for call in ("wait", "claim")]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(store._calls) < 2:  # both calls are waiting on the store's loop
        assert time.monotonic() < deadline, "the calls never reached the store"
        time.sleep(0.01)
    store.close()
    for thread in threads:
        thread.join(10)  # far less than the 20 s they would otherwise wait
    assert not [thread for thread in threads if thread.is_alive()]
    assert len(errors) == 2
    assert all(
        isinstance(error, ValidationError) and "closed while this call waited" in str(error)
        for error in errors
    ), errors


def test_close_twice_is_harmless_and_later_calls_say_the_store_is_closed(
    recwarn: pytest.WarningsRecorder,
) -> None:
    store = SyncStore(MemoryStore())
    store.close()
    store.close()
    with pytest.raises(ValidationError, match="SyncStore is closed; create a new one"):
        store.stats()
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_a_call_from_the_stores_own_loop_thread_is_an_error_not_a_deadlock() -> None:
    store = SyncStore(MemoryStore())

    async def call_from_the_loop_thread() -> None:
        store.stats()

    with pytest.raises(RuntimeError, match=r"own event loop thread.*await the store"):
        asyncio.run_coroutine_threadsafe(call_from_the_loop_thread(), store._loop).result(timeout=2)
    store.close()


async def test_a_call_from_a_running_event_loop_warns_to_await_the_store_instead() -> None:
    with SyncStore(MemoryStore()) as store:
        with pytest.warns(RuntimeWarning, match="blocks this thread's running event loop.*await"):
            assert store.stats().rollouts == {}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            store.stats()  # once per store is enough


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
