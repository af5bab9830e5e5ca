"""``fulgor runner`` as a real process tree: signals, draining, no orphans, nothing lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.process_support import alive, descendants

from fulgor.store import SqliteStore
from fulgor.types import RolloutConfig, RolloutRequest

ROOT = Path(__file__).resolve().parents[2]
# The checkout first (for the test agents), then whatever path this test run was given.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def start_runner(store_path: Path, grace_seconds: float, agent: str = "sleeper") -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "fulgor.cli.main", "runner",
        "--agent", f"tests.integration.sample_agents.slow_agent:{agent}",
        "--store", f"sqlite:///{store_path}",
        "--n-runners", "2",
        "--grace-seconds", str(grace_seconds),
        "--heartbeat-seconds", "0.3",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    assert "Ctrl+C to stop" in process.stdout.readline()
    return process


def enqueue(store_path: Path, seconds: list[float], unresponsive_seconds: float | None = None) -> list[str]:
    async def run() -> list[str]:
        store = SqliteStore(store_path)
        config = RolloutConfig(max_attempts=2, unresponsive_seconds=unresponsive_seconds)
        created = await store.enqueue([RolloutRequest(input={"seconds": s}, config=config) for s in seconds])
        await store.close()
        return [r.rollout_id for r in created]

    return asyncio.run(run())


def statuses(store_path: Path, rollout_ids: list[str]) -> list[str]:
    async def run() -> list[str]:
        store = SqliteStore(store_path)
        result: list[str] = [(await store.get_rollout(r)).status for r in rollout_ids]
        await store.close()
        return result

    return asyncio.run(run())


def wait_until(predicate: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def agent_pids(store_path: Path, rollout_ids: list[str]) -> set[int]:
    """The processes running the given rollouts' agents, from the message each sleeper records."""

    async def run() -> set[int]:
        store = SqliteStore(store_path)
        spans = [s for r in rollout_ids for s in await store.query_spans(r, name="fulgor.message")]
        await store.close()
        return {int(span.attributes["fulgor.message.body"].split()[1]) for span in spans}

    return asyncio.run(run())


class OutputLines:
    """Collects a process's output lines on a thread, so a test can wait for one to appear."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self._lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stdout:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()

    def wait_for(self, text: str, count: int, seconds: float) -> bool:
        """Wait until ``count`` lines contain ``text``; False if they have not after ``seconds``."""
        with self._changed:
            return self._changed.wait_for(lambda: sum(text in line for line in self._lines) >= count, seconds)


def test_first_sigint_drains_then_requeues_and_leaves_no_process(tmp_path: Path) -> None:
    store_path = tmp_path / "store.sqlite"
    quick, slow_a, slow_b = enqueue(store_path, [0.2, 60, 60])
    runner = start_runner(store_path, grace_seconds=1)
    assert wait_until(lambda: statuses(store_path, [quick])[0] == "succeeded", 60)
    assert wait_until(lambda: "queuing" not in statuses(store_path, [slow_a, slow_b]), 30)
    children = descendants(runner.pid)
    assert len(children) >= 2

    started = time.monotonic()
    runner.send_signal(signal.SIGINT)
    runner.wait(timeout=10)
    assert runner.returncode == 0
    # Within 10 s of Ctrl+C every process of the tree is gone (multiprocessing's helper included).
    assert wait_until(lambda: not [pid for pid in children if alive(pid)], 10 - (time.monotonic() - started))
    # Cut short, not lost: both slow rollouts went back to the queue for another runner.
    assert statuses(store_path, [quick, slow_a, slow_b]) == ["succeeded", "requeuing", "requeuing"]


def test_second_sigint_stops_at_once_without_orphans(tmp_path: Path) -> None:
    store_path = tmp_path / "store.sqlite"
    slow_a, slow_b = enqueue(store_path, [60, 60])
    runner = start_runner(store_path, grace_seconds=30)
    output = OutputLines(runner)
    # Both runner processes are running an agent (one rollout each, as --max-concurrency is 1):
    # the processes this test expects to see stopped exist before it signals anything.
    assert wait_until(lambda: len(agent_pids(store_path, [slow_a, slow_b])) == 2, 60)
    runners = agent_pids(store_path, [slow_a, slow_b])
    children = descendants(runner.pid)
    assert runners <= children
    assert all(alive(pid) for pid in children)

    started = time.monotonic()
    runner.send_signal(signal.SIGINT)
    # The second Ctrl+C comes during the drain: once both runners say they are waiting out the grace.
    assert output.wait_for("waiting up to 30s for 1 running rollouts", count=2, seconds=10)
    runner.send_signal(signal.SIGINT)
    runner.wait(timeout=10)
    # Well within the 30 s grace, every process of the tree is gone.
    assert wait_until(lambda: not [pid for pid in children if alive(pid)], 8 - (time.monotonic() - started))
    assert statuses(store_path, [slow_a, slow_b]) == ["requeuing", "requeuing"]


# With a grace period of 600 s too: a runner whose pool died stops now, nobody waits for its rollouts.
@pytest.mark.parametrize("grace_seconds", [0.5, 600.0])
def test_a_killed_parent_takes_its_children_down(tmp_path: Path, grace_seconds: float) -> None:
    store_path = tmp_path / "store.sqlite"
    rollout_ids = enqueue(store_path, [60])
    runner = start_runner(store_path, grace_seconds=grace_seconds)
    # Its agent runs the rollout: a runner that drained would wait it out.
    assert wait_until(lambda: agent_pids(store_path, rollout_ids), 30)
    children = descendants(runner.pid)
    runner.kill()
    runner.wait(timeout=5)
    assert wait_until(lambda: not [pid for pid in children if alive(pid)], 15)


@pytest.mark.parametrize(
    "spec", ["nomodule:agent", "tests.integration.sample_agents.slow_agent:missing", "bad"]
)
def test_bad_agent_spec_is_a_clear_error(tmp_path: Path, spec: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fulgor.cli.main",
            "runner",
            "--agent",
            spec,
            "--store",
            f"sqlite:///{tmp_path}/s.db",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "error:" in result.stderr
    assert spec.split(":")[0] in result.stderr


def test_a_bad_store_url_is_one_clear_error_not_a_traceback_per_worker(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fulgor.cli.main", "runner",
         "--agent", "tests.integration.sample_agents.slow_agent:sleeper", "--store", "foo://",
         "--n-runners", "2"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "error: unknown store URL 'foo://'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_installed_script_runs_an_agent_module_from_the_current_directory(tmp_path: Path) -> None:
    """`fulgor` (the console script) has its own folder first on sys.path, not the current one;
    the module must still be found, by the parent and by the runner processes it spawns."""
    script = Path(sys.executable).parent / "fulgor"
    if not script.exists():
        pytest.skip(f"no installed fulgor script next to {sys.executable}")
    (tmp_path / "cwd_agent_module.py").write_text(
        "import fulgor\n\n@fulgor.rollout\ndef solve(task):\n    return 1.0\n\nnot_an_agent = 42\n"
    )
    store_path = tmp_path / "store.sqlite"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def runner(agent: str) -> subprocess.Popen[str]:
        command = [
            str(script),
            "runner",
            "--agent",
            f"cwd_agent_module:{agent}",
            "--store",
            f"sqlite:///{store_path}",
        ]
        return subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    # Found, then refused for not being an agent: an error only an imported module can give.
    refused = runner("not_an_agent")
    _, stderr = refused.communicate(timeout=60)
    assert refused.returncode == 2
    assert "cannot import" not in stderr
    assert "'cwd_agent_module:not_an_agent' is not an agent" in stderr

    [rollout_id] = enqueue(store_path, [0])
    process = runner("solve")
    try:
        assert wait_until(lambda: statuses(store_path, [rollout_id]) == ["succeeded"], 60)
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr


def test_a_runner_killed_mid_rollout_goes_unresponsive_and_another_finishes_it(tmp_path: Path) -> None:
    store_path = tmp_path / "store.sqlite"
    [rollout_id] = enqueue(store_path, [0], unresponsive_seconds=2)
    runner = start_runner(store_path, grace_seconds=1, agent="dies_first_time")
    try:
        assert wait_until(lambda: statuses(store_path, [rollout_id]) == ["running"], 60)

        async def owner_pid() -> int:
            store = SqliteStore(store_path)
            [attempt] = await store.list_attempts(rollout_id)
            await store.close()
            assert attempt.worker_id is not None
            return int(attempt.worker_id.rsplit("-", 2)[1])

        # The worker id is host-pid-index, the pid being the pool's; find the child by its index.
        workers = descendants(runner.pid)
        assert asyncio.run(owner_pid()) == runner.pid
        victim = _child_running(store_path, rollout_id, workers)
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: statuses(store_path, [rollout_id]) == ["succeeded"], 60)

        async def attempts() -> list[str]:
            store = SqliteStore(store_path)
            result: list[str] = [a.status for a in await store.list_attempts(rollout_id)]
            await store.close()
            return result

        assert asyncio.run(attempts()) == ["unresponsive", "succeeded"]
    finally:
        runner.send_signal(signal.SIGINT)
        runner.wait(timeout=15)


def _child_running(store_path: Path, rollout_id: str, workers: set[int]) -> int:
    """The runner process whose message span says it runs the rollout's first attempt."""

    async def pid() -> int:
        store = SqliteStore(store_path)
        spans = await store.query_spans(rollout_id, name="fulgor.message")
        await store.close()
        return int(spans[0].attributes["fulgor.message.body"].rsplit(" ", 1)[1])

    child = asyncio.run(pid())
    assert child in workers
    return child
