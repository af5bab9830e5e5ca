"""What the tests start stays on loopback, recorded from outside: ``fulgor train --runners ray`` (a
Trainer on a Ray instance it starts on this machine), the ranks of ``fulgor train --nproc``, and
Chromium as the browser tests drive it, each run in a network namespace of its own with one
non-loopback address (``.ci/loopback-only``) under strace; every connect, bind and DNS send of them
and their children is read back, and any that left loopback fails the test with the process that
made it. Where namespaces or strace are missing, the tests skip and say why.

The audit hook of ``tests/loopback_guard.py`` sees only the test process; these see everything.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest
from tests.loopback_support import ROOT, endpoints_beyond_loopback, namespace_unavailable, run_traced
from tests.offline import closed_proxies

from examples.calc.dataset import make_splits
from fulgor.store.sqlite import SqliteStore

# Each runs a traced command of up to 10 minutes (a Trainer on Ray under strace, on busy cores).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", autouse=True)
def traced_namespace() -> None:
    why = namespace_unavailable()
    if why is not None:
        pytest.skip(f"no traced loopback-only network namespace here: {why}")


def assert_on_loopback(trace: str) -> None:
    found = endpoints_beyond_loopback(trace)
    assert not found, f"{len(found)} beyond loopback, the first:\n" + "\n".join(map(str, found[:20]))


def session_dirs(trace: str) -> set[Path]:
    """The session directories of the Ray processes a strace record saw start."""
    return {Path(found) for found in re.findall(r"--session-dir=([^\"\s]+)", trace)}


async def workers_of(store_path: Path) -> set[str]:
    store = SqliteStore(store_path)
    try:
        rollouts = await store.query_rollouts()
        return {a.worker_id or "" for r in rollouts for a in await store.list_attempts(r.rollout_id)}
    finally:
        await store.close()


def test_fulgor_train_on_ray_runners_stays_on_loopback(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("ray", reason="the ray extra is installed by make test")
    from fulgor.engine.models import init_model

    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    train = tmp_path / "train.jsonl"
    train.write_text(
        "".join(json.dumps(task) + "\n" for task in make_splits(seed=0, sizes=(8, 4, 4))["train"])
    )
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "fulgor.cli.main", "train", "--agent", "examples.calc.agent:calc_agent",
        "--train", str(train), "--model", str(model), "--run-dir", str(run_dir), "--device", "cpu",
        "--runners", "ray", "--n-runners", "2", "--steps", "1", "--group-size", "2", "--batch-tasks", "2",
        "--max-tokens", "8",
    ]  # fmt: skip
    trace_file = tmp_path / "strace.log"
    with closed_proxies():  # Ray's dashboard probes the cloud metadata servers, a probe with no switch
        # Without the test session's Ray switches: what keeps this instance on loopback is fulgor's.
        env = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
        done = run_traced(command, trace_file, timeout_seconds=600, env=env, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert (run_dir / "checkpoints" / "step-1" / "config.json").is_file()
    workers = asyncio.run(workers_of(run_dir / "store.sqlite"))
    assert workers
    assert all(worker.startswith("ray-") for worker in workers)  # Ray actors ran the rollouts
    trace = trace_file.read_text(errors="replace")
    assert "raylet" in trace  # Ray's processes ran under the record
    assert_on_loopback(trace)
    # And Ray was told to send no usage report: its dashboard says so in the session's log.
    [session] = session_dirs(trace)
    assert "Usage reporting is disabled" in (session / "logs" / "dashboard.log").read_text()


def test_the_ranks_of_nproc_meet_on_loopback_only(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from fulgor.training.distributed import local_torchrun

    folder = tmp_path / "ranks"
    folder.mkdir()
    options, environment = local_torchrun(2, folder)
    env = {**os.environ, **environment, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", *options, "-m", "tests.integration.two_ranks"]
    trace_file = tmp_path / "strace.log"
    done = run_traced(command, trace_file, timeout_seconds=600, env=env, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert sorted(re.findall(r"rank \d: 2\.0", done.stdout)) == ["rank 0: 2.0", "rank 1: 2.0"]
    assert_on_loopback(trace_file.read_text(errors="replace"))


def test_chromium_as_the_browser_tests_drive_it_stays_on_loopback(tmp_path: Path) -> None:
    trace_file = tmp_path / "strace.log"
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
        "tests/browser/test_dashboard_browser.py",
    ]  # fmt: skip
    done = run_traced(command, trace_file, timeout_seconds=600, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    skipped = re.search(r"^SKIPPED .*", done.stdout, re.MULTILINE)
    if skipped:  # no Chromium here (under CI the browser tests fail instead)
        pytest.skip(f"the browser tests skipped: {skipped.group()}")
    assert re.search(r"\b\d+ passed", done.stdout), done.stdout[-2000:]
    trace = trace_file.read_text(errors="replace")
    assert "chromium" in trace  # the browser ran under the record
    assert_on_loopback(trace)
