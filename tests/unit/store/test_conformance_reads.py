"""Store conformance: query_rollouts, resources, workers, wait and stats, on every backend."""

from __future__ import annotations

import asyncio
import time

import pytest
from storetools import START_TIME, FakeClock, MakeStore, counts, request, span

from fulgor.errors import NotFoundError
from fulgor.store.base import Store
from fulgor.types import LLM, PromptTemplate

# -- query_rollouts ---------------------------------------------------------------------------------


async def populated(store: Store) -> list[str]:
    """Six rollouts, in enqueue order: queuing, preparing, running, succeeded, failed, cancelled."""
    created = await store.enqueue(
        [
            request({"n": 0}, group_id="a", mode="train"),
            request({"n": 1}, group_id="a", mode="val"),
            request({"n": 2}, group_id="b", mode="train"),
            request({"n": 3}, group_id="b", mode="test"),
            request({"n": 4}, group_id="a", mode="train"),
            request({"n": 5}, mode="val"),
        ]
    )
    ids = [r.rollout_id for r in created]
    for rollout_id in ids[1:5]:
        await store.start_attempt(rollout_id, "w1")
    attempts = {rid: (await store.list_attempts(rid))[0].attempt_id for rid in ids[1:5]}
    await store.add_spans([span(ids[2], attempts[ids[2]])])
    await store.update_attempt(ids[3], attempts[ids[3]], status="succeeded")
    await store.update_attempt(ids[4], attempts[ids[4]], status="failed")
    await store.cancel([ids[5]])
    return ids


async def test_query_rollouts_by_status(store: Store) -> None:
    ids = await populated(store)
    statuses = ["queuing", "preparing", "running", "succeeded", "failed", "cancelled"]

    for rollout_id, status in zip(ids, statuses, strict=True):
        assert [r.rollout_id for r in await store.query_rollouts(status=status)] == [rollout_id]
    assert await store.query_rollouts(status="requeuing") == []
    chosen = await store.query_rollouts(status=["cancelled", "queuing", "succeeded"])
    assert [r.rollout_id for r in chosen] == [ids[0], ids[3], ids[5]]
    assert await store.query_rollouts(status=[]) == []


async def test_query_rollouts_by_group_and_mode(store: Store) -> None:
    ids = await populated(store)

    assert [r.rollout_id for r in await store.query_rollouts(group_id="a")] == [ids[0], ids[1], ids[4]]
    assert [r.rollout_id for r in await store.query_rollouts(mode="val")] == [ids[1], ids[5]]
    assert [r.rollout_id for r in await store.query_rollouts(group_id="a", mode="train")] == [ids[0], ids[4]]
    both = await store.query_rollouts(group_id="b", status=["succeeded", "queuing"], mode="test")
    assert [r.rollout_id for r in both] == [ids[3]]
    assert await store.query_rollouts(group_id="missing") == []


async def test_an_empty_filter_matches_only_empty_values(store: Store) -> None:
    # Over HTTP an empty filter is an empty query value: it filters, as it does locally.
    empty, named = await store.enqueue([request({"n": 0}, group_id=""), request({"n": 1}, group_id="g")])
    (claimed,) = await store.claim("w1")
    await store.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id, name="step")])

    assert [r.rollout_id for r in await store.query_rollouts(group_id="")] == [empty.rollout_id]
    assert await store.query_spans(claimed.rollout_id, name="") == []
    assert [s.name for s in await store.query_spans(claimed.rollout_id, name="step")] == ["step"]
    assert named.group_id == "g"


async def test_query_rollouts_pages_in_either_order(store: Store) -> None:
    ids = await populated(store)

    assert [r.rollout_id for r in await store.query_rollouts()] == ids
    assert [r.rollout_id for r in await store.query_rollouts(order="desc")] == ids[::-1]
    assert [r.rollout_id for r in await store.query_rollouts(limit=2, offset=1)] == ids[1:3]
    assert [r.rollout_id for r in await store.query_rollouts(order="desc", limit=2, offset=1)] == [
        ids[4],
        ids[3],
    ]
    assert [r.rollout_id for r in await store.query_rollouts(offset=4)] == ids[4:]
    assert await store.query_rollouts(limit=0) == []
    assert await store.query_rollouts(offset=6) == []
    assert [r.rollout_id for r in await store.query_rollouts(group_id="a", limit=1, offset=1)] == [ids[1]]


async def test_query_rollouts_includes_started_rollouts_in_creation_order(store: Store) -> None:
    (first,) = await store.enqueue([request({"n": 0})])
    started = await store.start_rollout(request({"n": 1}), "w1")
    (last,) = await store.enqueue([request({"n": 2})])

    ids = [r.rollout_id for r in await store.query_rollouts()]

    assert ids == [first.rollout_id, started.rollout_id, last.rollout_id]


# -- resources --------------------------------------------------------------------------------------


async def test_no_resources_before_the_first_put(store: Store) -> None:
    assert await store.get_resources() is None
    with pytest.raises(NotFoundError):
        await store.get_resources("nothing")


async def test_put_resources_versions_increase_and_latest_moves(store: Store, clock: FakeClock) -> None:
    llm = {
        "llm": LLM(endpoint="http://127.0.0.1:1/v1", model="tiny", sampling_parameters={"temperature": 0.7})
    }
    prompt = {"prompt": PromptTemplate(template="Solve {question}")}

    first = await store.put_resources(llm)
    clock.advance(1)
    second = await store.put_resources(prompt, "named")

    assert (first.version, second.version) == (1, 2)
    assert second.resources_id == "named"
    assert first.resources_id != second.resources_id
    assert (first.resources, first.create_time, second.create_time) == (llm, START_TIME, START_TIME + 1)
    assert await store.get_resources() == second
    assert await store.get_resources(first.resources_id) == first
    assert (await store.stats()).resources_versions == 2


async def test_put_with_a_known_id_replaces_it_as_the_new_latest(store: Store) -> None:
    old = await store.put_resources({"p": PromptTemplate(template="v1")}, "prompt")
    other = await store.put_resources({"p": PromptTemplate(template="other")})

    new = await store.put_resources({"p": PromptTemplate(template="v2")}, "prompt")

    assert (new.resources_id, new.version) == ("prompt", 3)
    assert new.version > max(old.version, other.version)
    assert await store.get_resources("prompt") == new
    assert await store.get_resources() == new
    assert await store.get_resources(other.resources_id) == other


# -- workers ----------------------------------------------------------------------------------------


async def test_heartbeat_records_workers_in_order_of_appearance(store: Store, clock: FakeClock) -> None:
    first = await store.heartbeat("w1", {"cpu": 0.5})
    clock.advance(2)
    await store.heartbeat("w2")
    clock.advance(3)
    again = await store.heartbeat("w1")

    assert (first.first_seen_time, first.last_heartbeat_time, first.stats) == (
        START_TIME,
        START_TIME,
        {"cpu": 0.5},
    )
    assert (again.first_seen_time, again.last_heartbeat_time) == (START_TIME, START_TIME + 5)
    workers = await store.list_workers()
    assert [w.worker_id for w in workers] == ["w1", "w2"]
    assert workers[0] == again
    assert (await store.stats()).workers == 2


async def test_heartbeat_stats_replace_the_previous_ones(store: Store) -> None:
    await store.heartbeat("w1", {"cpu": 0.5})
    await store.heartbeat("w1", {"gpu": 1})

    assert (await store.list_workers())[0].stats == {"gpu": 1}


async def test_claiming_work_makes_a_worker_known(store: Store) -> None:
    await store.enqueue([request()])

    await store.claim("runner-7")

    assert [w.worker_id for w in await store.list_workers()] == ["runner-7"]


async def test_heartbeat_keeps_a_preparing_attempt_preparing(store: Store, clock: FakeClock) -> None:
    # The rollout moves to running on its first span or update (store.base); a heartbeat only says
    # the worker process is alive, not that the agent has started.
    (rollout,) = await store.enqueue([request()])
    await store.claim("w1")
    clock.advance(3)

    await store.heartbeat("w1")

    (attempt,) = await store.list_attempts(rollout.rollout_id)
    assert (attempt.status, attempt.last_active_time) == ("preparing", START_TIME + 3)
    assert (await store.get_rollout(rollout.rollout_id)).status == "preparing"


# -- wait -------------------------------------------------------------------------------------------


async def test_wait_returns_at_once_when_all_are_terminal(make_store: MakeStore) -> None:
    store = await make_store()
    created = await store.enqueue([request({"n": 0}), request({"n": 1})])
    await store.cancel([r.rollout_id for r in created])
    started = time.monotonic()

    done = await store.wait([r.rollout_id for r in created], timeout_seconds=10)

    assert [(r.rollout_id, r.status) for r in done] == [(r.rollout_id, "cancelled") for r in created]
    assert time.monotonic() - started < 1.0


async def test_wait_wakes_when_the_last_one_ends(make_store: MakeStore) -> None:
    store = await make_store()
    created = await store.enqueue([request({"n": 0}), request({"n": 1})])
    claimed = await store.claim("w1", limit=2)

    async def finish() -> None:
        await asyncio.sleep(0.05)
        await store.update_attempt(claimed[0].rollout_id, claimed[0].attempt.attempt_id, status="succeeded")
        await asyncio.sleep(0.05)
        await store.update_attempt(claimed[1].rollout_id, claimed[1].attempt.attempt_id, status="failed")

    started = time.monotonic()
    done, _ = await asyncio.gather(store.wait([r.rollout_id for r in created], timeout_seconds=10), finish())

    assert [(r.rollout_id, r.status) for r in done] == [
        (created[0].rollout_id, "succeeded"),
        (created[1].rollout_id, "failed"),
    ]
    assert time.monotonic() - started < 2.0


async def test_wait_timeout_returns_the_terminal_ones_so_far(make_store: MakeStore) -> None:
    store = await make_store()
    created = await store.enqueue([request({"n": 0}), request({"n": 1}), request({"n": 2})])
    await store.cancel([created[1].rollout_id])
    started = time.monotonic()

    done = await store.wait([r.rollout_id for r in created], timeout_seconds=0.3)

    assert [r.rollout_id for r in done] == [created[1].rollout_id]
    assert 0.25 <= time.monotonic() - started < 3.0
    assert await store.wait([created[0].rollout_id], timeout_seconds=0) == []


# -- stats ------------------------------------------------------------------------------------------


async def test_stats_of_an_empty_store(store: Store) -> None:
    assert counts(await store.stats()) == ({}, {}, 0, 0, 0)


async def test_stats_count_everything(store: Store) -> None:
    ids = await populated(store)
    (claimed,) = await store.claim("w2")
    await store.add_spans([span(claimed.rollout_id, claimed.attempt.attempt_id, name="x")])
    await store.put_resources({"p": PromptTemplate(template="x")})
    await store.heartbeat("w3")

    rollouts, attempts, spans, workers, versions = counts(await store.stats())

    assert claimed.rollout_id == ids[0]
    assert rollouts == {"running": 2, "preparing": 1, "succeeded": 1, "failed": 1, "cancelled": 1}
    assert attempts == {"running": 2, "preparing": 1, "succeeded": 1, "failed": 1}
    assert (spans, versions) == (2, 1)
    assert workers >= 2  # w2 claimed, w3 sent a heartbeat; w1 only used start_attempt
    for status, n in rollouts.items():
        assert len(await store.query_rollouts(status=status)) == n  # type: ignore[arg-type]
