"""The Job dispatcher against the simulated Kubernetes API server: the rate limit, heartbeats,
orphaned Jobs reconciled, a deadline, a stop that leaves nothing, the API verbs it uses."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes extra is installed by make test")

from fulgor import ConfigError, FulgorError, RolloutConfig, RolloutRequest
from fulgor.runner.job_template import LABEL_ATTEMPT, LABEL_ROLLOUT, LABEL_RUN
from fulgor.runner.kubernetes_jobs import JobDispatcher, JobSettings, load_batch_api
from fulgor.store.memory import MemoryStore
from fulgor.testing.kubernetes_api import SimulatedKubernetesAPI


def test_a_kubeconfig_that_cannot_be_read_is_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot load the Kubernetes configuration"):
        load_batch_api(str(tmp_path / "missing"), None)


# -- the dispatcher on the simulated API server ------------------------------------------------------

SLEEPER = f"""
spec:
  template:
    spec:
      containers:
        - name: agent
          command: [{sys.executable}, -c, "import os, time; time.sleep(float(os.environ['SLEEP']))"]
"""


@pytest.fixture
def api(tmp_path: Path) -> Any:
    with SimulatedKubernetesAPI(token="t") as simulated:
        yield simulated


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    store = MemoryStore()
    yield store
    await store.close()


def dispatcher(
    api: SimulatedKubernetesAPI, store: MemoryStore, tmp_path: Path, **options: Any
) -> JobDispatcher:
    settings = JobSettings(
        run="unit", namespace="default", server_url="http://127.0.0.1:9",
        operator_key="key", poll_seconds=0.1, claim_wait_seconds=0.2,
        **{"template": SLEEPER, "env": {"SLEEP": "0"}, "max_jobs": 4, **options},
    )  # fmt: skip
    batch = load_batch_api(str(api.write_kubeconfig(tmp_path / "kubeconfig")), None)
    return JobDispatcher(settings, store, batch)


async def until(condition: Any, seconds: float = 20.0) -> None:
    """Check ``condition`` every 20 ms until it holds: the simulation's processes have no event to wait on."""
    async with asyncio.timeout(seconds):
        for _ in itertools.count():
            if condition():
                return
            await asyncio.sleep(0.02)


async def statuses(store: MemoryStore, rollout_ids: list[str]) -> list[list[str]]:
    return [[a.status for a in await store.list_attempts(r)] for r in rollout_ids]


async def enqueue(store: MemoryStore, count: int, **config: Any) -> list[str]:
    requests = [RolloutRequest(input={"i": i}, config=RolloutConfig(**config)) for i in range(count)]
    return [rollout.rollout_id for rollout in await store.enqueue(requests)]


async def test_creations_are_spaced_by_the_rate_limit(api: Any, store: MemoryStore, tmp_path: Path) -> None:
    ids = await enqueue(store, 4)
    jobs = dispatcher(api, store, tmp_path, max_jobs_per_second=5.0)
    await jobs.start()
    try:
        await store.wait(ids, timeout_seconds=30)
    finally:
        await jobs.stop()
    assert await statuses(store, ids) == [["succeeded"]] * 4
    times = [moment for _, moment in api.creations]
    assert len(times) == 4
    # Spaced from each creation's answer, so at least 1 / 5 s apart as the API server receives them.
    assert all(later - earlier >= 0.2 for earlier, later in itertools.pairwise(times))


async def test_orphans_are_deleted_at_start_and_live_attempts_jobs_are_kept(
    api: Any, store: MemoryStore, tmp_path: Path
) -> None:
    [live] = await enqueue(store, 1)
    [claimed] = await store.claim("another-trainer")  # its Job runs, created by another trainer
    kept = _job(f"unit-{claimed.attempt.attempt_id}", live, claimed.attempt.attempt_id)
    orphan = _job("unit-at-gone", "ro-gone", "at-gone")  # an earlier session's, unknown to the store
    other_run = _job("other-at-gone", "ro-gone", "at-gone", run="other")
    batch = load_batch_api(str(api.write_kubeconfig(tmp_path / "kubeconfig")), None)
    for body in (kept, orphan, other_run):
        await asyncio.to_thread(batch.create_namespaced_job, "default", body)
    batch.api_client.close()
    second = dispatcher(api, store, tmp_path)
    await second.start()
    try:
        names = {job["metadata"]["name"] for job in api.jobs()}
        assert names == {f"unit-{claimed.attempt.attempt_id}", "other-at-gone"}  # the live one, another run's
        await store.cancel([live])  # its attempt ends: the next poll deletes its Job
        await until(lambda: {job["metadata"]["name"] for job in api.jobs()} == {"other-at-gone"})
    finally:
        await second.stop()
    assert [name for name, _ in api.deletions] == ["unit-at-gone", f"unit-{claimed.attempt.attempt_id}"]
    assert api.processes_running() == 1  # the other run's Job is not this run's to delete


async def test_a_job_past_its_deadline_times_its_attempt_out(
    api: Any, store: MemoryStore, tmp_path: Path
) -> None:
    # The template's own deadline: with the rollout's timeout, the store's watchdog may end the
    # attempt first (then the Job is deleted as an attempt the store ended).
    [rollout_id] = await enqueue(store, 1, timeout_seconds=None, max_attempts=1)
    template = SLEEPER.replace("  template:", "  activeDeadlineSeconds: 1\n  template:", 1)
    jobs = dispatcher(api, store, tmp_path, env={"SLEEP": "30"}, template=template)
    await jobs.start()
    try:
        await store.wait([rollout_id], timeout_seconds=30)
    finally:
        await jobs.stop()
    [attempt] = await store.list_attempts(rollout_id)
    assert attempt.status == "timeout"
    assert attempt.error == f"Job unit-{attempt.attempt_id} ran past its activeDeadlineSeconds (1)"
    assert api.processes_running() == 0


async def test_stop_fails_running_attempts_and_deletes_every_job(
    api: Any, store: MemoryStore, tmp_path: Path
) -> None:
    ids = await enqueue(store, 3, max_attempts=1)
    jobs = dispatcher(api, store, tmp_path, env={"SLEEP": "60"}, max_jobs=2)
    await jobs.start()
    await until(lambda: api.processes_running() == 2)
    await jobs.stop()
    assert not api.jobs()
    assert api.processes_running() == 0
    assert {policy for _, policy in api.deletions} == {"Background"}
    attempts = [a for r in ids for a in await store.list_attempts(r)]
    assert len(attempts) == 2  # max_jobs: the third rollout was never claimed
    assert all(
        a.status == "failed" and "the trainer stopped before Job unit-" in (a.error or "") for a in attempts
    )


def _job(name: str, rollout_id: str, attempt_id: str, run: str = "unit") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {LABEL_RUN: run},
            "annotations": {LABEL_ROLLOUT: rollout_id, LABEL_ATTEMPT: attempt_id},
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "a", "command": [sys.executable, "-c", "import time; time.sleep(60)"]}
                    ],
                }
            }
        },
    }


async def test_an_api_server_out_of_reach_fails_the_start_with_what_it_tried(
    store: MemoryStore, tmp_path: Path
) -> None:
    with SimulatedKubernetesAPI() as gone:
        kubeconfig = gone.write_kubeconfig(tmp_path / "kubeconfig")  # its port is closed once it stops
    settings = JobSettings(
        template=SLEEPER, run="unit", namespace="default", server_url="http://x", operator_key="k"
    )
    jobs = JobDispatcher(settings, store, load_batch_api(str(kubeconfig), None))
    with pytest.raises(FulgorError, match="could not reach the Kubernetes API to list Jobs"):
        await jobs.start()
    jobs.close()


async def test_the_dispatcher_needs_create_list_and_delete_on_jobs_only(
    api: Any, store: MemoryStore, tmp_path: Path
) -> None:
    ids = await enqueue(store, 2, max_attempts=1)
    jobs = dispatcher(api, store, tmp_path)
    await jobs.start()
    try:
        await store.wait(ids, timeout_seconds=30)
    finally:
        await jobs.stop()
    collection, one = "/apis/batch/v1/namespaces/default/jobs", "/apis/batch/v1/namespaces/default/jobs/"
    verbs = {
        ("create" if method == "POST" else "list" if method == "GET" else "delete")
        for method, path in api.requests
        if path == collection or (method == "DELETE" and path.startswith(one))
    }
    assert verbs == {"create", "list", "delete"}  # the README's Role
    assert all(
        path == collection or (method == "DELETE" and path.startswith(one)) for method, path in api.requests
    )


async def test_a_task_no_variable_can_hold_fails_its_attempt_without_a_job(
    api: Any, store: MemoryStore, tmp_path: Path
) -> None:
    [rollout] = await store.enqueue(
        [RolloutRequest(input="x" * 140_000, config=RolloutConfig(max_attempts=1))]
    )
    jobs = dispatcher(api, store, tmp_path)
    await jobs.start()
    try:
        await store.wait([rollout.rollout_id], timeout_seconds=30)
    finally:
        await jobs.stop()
    [attempt] = await store.list_attempts(rollout.rollout_id)
    assert attempt.status == "failed"
    assert "a Job passes it in FULGOR_TASK" in (attempt.error or "")
    assert api.creations == []


async def test_running_jobs_keep_their_attempts_alive(api: Any, store: MemoryStore, tmp_path: Path) -> None:
    # Each poll heartbeats the attempts whose Jobs run: 1.5 s of work outlives unresponsive_seconds.
    [rollout_id] = await enqueue(store, 1, unresponsive_seconds=0.6, max_attempts=1)
    jobs = dispatcher(api, store, tmp_path, env={"SLEEP": "1.5"})
    await jobs.start()
    try:
        await store.wait([rollout_id], timeout_seconds=30)
    finally:
        await jobs.stop()
    assert [a.status for a in await store.list_attempts(rollout_id)] == ["succeeded"]
