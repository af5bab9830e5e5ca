"""Ctrl+C on ``Trainer.fit``: a real training run in a process of its own, interrupted mid-step.

The first SIGINT cancels the rollouts the run had not finished, so the runners stop their agents
and nothing is left queued for a later run, and ``fit`` raises only once every service has
stopped: no process below it, no port. A second SIGINT while the runners drain stops them at once.
The runners' grace period is 600 s here, so a run that ends within the test's bounds did not wait
it out. The run is :mod:`tests.integration.interrupted_fit`; what it reports, it saw at the moment
``fit`` raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.integration.interrupted_fit import REPORT
from tests.process_support import alive, descendants, take_sigint

from fulgor import semconv
from fulgor.engine.models import init_model
from fulgor.store import SqliteStore
from fulgor.types import Rollout

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
GRACE_SECONDS = 600
# Far below the grace period, far above what stopping takes (engine, server, runner processes).
EXIT_SECONDS = 120
ROLLOUTS = 4  # one step: 2 tasks x 2 rollouts, two on each of the 2 runners (2 at a time each)
RUN = "from tests.integration.interrupted_fit import main; main()"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("interrupt") / "tiny", "tiny", seed=0)


@dataclass
class Run:
    process: subprocess.Popen[str]
    run_dir: Path
    markers: Path
    output: Path
    processes: set[int] = field(default_factory=set)  # below the trainer, once its agents ran

    def marked(self, suffix: str) -> dict[str, int]:
        """The agents' markers of one kind: the pid of each rollout's agent, by rollout id."""
        return {path.stem: int(path.read_text()) for path in self.markers.glob(f"*.{suffix}")}

    def runner_log(self) -> str:
        path = self.run_dir / "logs" / "runners.log"
        return path.read_text() if path.exists() else ""

    def explain(self) -> str:
        return f"output:\n{self.output.read_text()}\nrunners.log:\n{self.runner_log()}"

    def left_when_fit_raised(self) -> dict[str, Any]:
        [line] = [line for line in self.output.read_text().splitlines() if line.startswith(REPORT)]
        left: dict[str, Any] = json.loads(line.removeprefix(REPORT))
        return left

    def wait(self, after: str) -> None:
        try:
            self.process.wait(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run was still going {EXIT_SECONDS}s after {after}\n{self.explain()}")


@pytest.fixture
def start_run(tmp_path: Path, model_dir: Path) -> Iterator[Callable[[bool], Run]]:
    started: list[Run] = []

    def start(stubborn: bool) -> Run:
        run_dir, markers, output = tmp_path / "run", tmp_path / "markers", tmp_path / "output.txt"
        markers.mkdir()
        kind = "stubborn" if stubborn else "cooperative"
        arguments = [str(model_dir), str(run_dir), str(markers), kind, str(GRACE_SECONDS)]
        with output.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, "-c", RUN, *arguments],
                cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT, text=True,
                preexec_fn=take_sigint,
            )  # fmt: skip
        started.append(Run(process, run_dir, markers, output))
        return started[-1]

    yield start
    for run in started:  # a failed test leaves nothing of its run behind
        for pid in run.processes | descendants(run.process.pid):
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        run.process.kill()
        run.process.wait(timeout=30)


def wait_until(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def every_agent_running(run: Run) -> None:
    """Wait until the step's agents all run, each with its model call answered; check that they run
    in the two runner processes below the trainer, and remember those processes."""
    assert wait_until(lambda: len(run.marked("running")) == ROLLOUTS or run.process.poll() is not None, 300)
    assert run.process.poll() is None, run.explain()
    processes = descendants(run.process.pid)
    agents = set(run.marked("running").values())
    assert len(agents) == 2
    assert agents <= processes
    assert all(alive(pid) for pid in processes)
    run.processes = processes


def read_rollouts(run_dir: Path) -> tuple[list[Rollout], int]:
    """The run's rollouts and how many model calls they made."""

    async def read() -> tuple[list[Rollout], int]:
        store = SqliteStore(run_dir / "store.sqlite")
        rollouts = await store.query_rollouts()
        calls = 0
        for each in rollouts:
            calls += len(await store.query_spans(each.rollout_id, name=semconv.SPAN_MODEL_CALL))
        await store.close()
        return rollouts, calls

    return asyncio.run(read())


def assert_stopped_cleanly(run: Run) -> None:
    """fit raised only once every process below it had ended and every port had closed; the step's
    rollouts are all cancelled, their calls recorded."""
    assert run.process.returncode == 130, run.explain()
    assert run.left_when_fit_raised() == {"processes": [], "listening": []}
    assert not [pid for pid in run.processes if alive(pid)]
    rollouts, calls = read_rollouts(run.run_dir)
    assert [r.status for r in rollouts] == ["cancelled"] * ROLLOUTS
    assert {r.rollout_id for r in rollouts} == set(run.marked("running"))
    assert calls == ROLLOUTS


def test_ctrl_c_cancels_the_unfinished_rollouts_stops_their_agents_and_leaves_nothing(
    start_run: Callable[[bool], Run],
) -> None:
    run = start_run(False)
    every_agent_running(run)

    run.process.send_signal(signal.SIGINT)
    run.wait(after="Ctrl+C")

    # Each agent was asked to stop, its rollout having been cancelled: the grace did not run out.
    assert run.marked("stopping") == run.marked("running")
    assert_stopped_cleanly(run)


def test_a_second_ctrl_c_while_the_runners_drain_stops_them_at_once(
    start_run: Callable[[bool], Run],
) -> None:
    run = start_run(True)  # its agents ignore the first request to stop
    every_agent_running(run)

    run.process.send_signal(signal.SIGINT)
    # The drain is under way: each agent was asked to stop and hangs on, both runners wait out
    # their grace period, and fit has not raised.
    assert wait_until(lambda: len(run.marked("stopping")) == ROLLOUTS, 60), run.explain()
    draining = f"waiting up to {GRACE_SECONDS}s for 2 running rollouts"  # once per runner
    assert wait_until(lambda: run.runner_log().count(draining) == 2, 60), run.explain()
    assert REPORT not in run.output.read_text()

    run.process.send_signal(signal.SIGINT)
    run.wait(after="a second Ctrl+C")
    assert_stopped_cleanly(run)
