"""Ctrl+C always ends clean, and nothing outlives its parent.

- ``fulgor engine`` on SIGINT or SIGTERM, idle or generating (a stream and a whole answer at
  once), also when started with SIGINT ignored: it ends the requests in flight, stops in order and
  exits 0, without the abort a generation thread cut short inside torch causes.
- The calc demo (``python -m examples.calc.train``, what ``make demo`` runs) on Ctrl+C during its
  warm start, its first validation and a GRPO step: every process below it, whatever its session,
  is gone within 10 s of the signal (the pids are read from /proc before it is sent), and the demo
  exits 130 without an abort or a traceback, naming the ``--run-dir`` that continues the run.
- A runner pool (its runner blocked in a long-poll claim, its agent program running) and an engine
  (idle or generating) whose parent is SIGKILLed end by themselves within 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("openai")

from tests.process_support import alive, command_line, descendants, gone_within
from tests.reliability.parents import AGENT_PROGRAM, LONG_ANSWER

from fulgor.engine.models import init_model
from fulgor.store import SqliteStore
from fulgor.types import RolloutStatus

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
BOUND_SECONDS = 10.0  # what the processes below an interrupted or killed parent get to end
ABORT = "terminate called"
POOL = "fulgor.training._pool"


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 180.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def still_alive_after(pids: set[int], seconds: float) -> set[int]:
    """Those of ``pids`` still running ``seconds`` from now (returns as soon as none is)."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {pid for pid in pids if alive(pid)}


def kill_leftovers(pids: set[int]) -> None:
    """A failed test leaves nothing behind for later ones."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("shutdown") / "tiny", "tiny", seed=0).resolve()


# -- the engine on SIGINT and SIGTERM ---------------------------------------------------------------


@dataclass
class Engine:
    process: subprocess.Popen[str]
    url: str
    log: Path
    outcomes: dict[str, Any] = field(default_factory=dict)  # what each client in flight got
    clients: list[threading.Thread] = field(default_factory=list)

    def stderr(self) -> str:
        return self.log.read_text()


@pytest.fixture
def start_engine(model_dir: Path, tmp_path: Path) -> Iterator[Callable[[bool], Engine]]:
    started: list[subprocess.Popen[str]] = []

    def start(ignore_sigint: bool) -> Engine:
        log = tmp_path / "engine.log"
        command = [sys.executable, "-m", "fulgor.cli.main", "engine", "--model", str(model_dir)]
        command += ["--port", "0", "--threads", "1"]
        # What a background job of a non-interactive shell inherits, or the default.
        handler = signal.SIG_IGN if ignore_sigint else signal.SIG_DFL
        with log.open("w") as errors:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=errors, text=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, handler),
            )  # fmt: skip
        started.append(process)
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://"), log.read_text()
        return Engine(process, url, log)

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def stream_answer(engine: Engine, model: str) -> None:
    """A streamed answer of many tokens; records its last event."""
    body = {**LONG_ANSWER, "model": model}
    last = ""
    try:
        with httpx.stream("POST", f"{engine.url}/v1/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    last = line.removeprefix("data: ")
    except httpx.HTTPError as error:
        last = f"{type(error).__name__}: {error}"
    engine.outcomes["stream"] = last


def whole_answer(engine: Engine, model: str) -> None:
    """An answer of many tokens, sent whole; records its status."""
    body = {**LONG_ANSWER, "model": model, "stream": False}
    try:
        engine.outcomes["whole"] = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=60)
    except httpx.HTTPError as error:
        engine.outcomes["whole"] = f"{type(error).__name__}: {error}"


def generate(engine: Engine, model: str) -> None:
    """Two requests in flight, one streamed, one whole, both generating when this returns."""
    for client in (stream_answer, whole_answer):
        engine.clients.append(threading.Thread(target=client, args=(engine, model), daemon=True))
        engine.clients[-1].start()
    wait_until(lambda: httpx.get(f"{engine.url}/health").json()["running"] == 2, "both requests running")


CASES = [
    pytest.param(signal.SIGINT, False, id="SIGINT"),
    pytest.param(signal.SIGTERM, False, id="SIGTERM"),
    pytest.param(signal.SIGINT, True, id="SIGINT-inherited-ignored"),
]


@pytest.mark.parametrize(("sig", "ignore_sigint"), CASES)
def test_the_engine_stops_on_a_signal_while_idle_and_exits_0(
    start_engine: Callable[[bool], Engine], sig: signal.Signals, ignore_sigint: bool
) -> None:
    engine = start_engine(ignore_sigint)
    assert httpx.get(f"{engine.url}/health").json()["running"] == 0
    engine.process.send_signal(sig)
    assert engine.process.wait(timeout=60) == 0, engine.stderr()
    assert_stopped_in_order(engine)


@pytest.mark.parametrize(("sig", "ignore_sigint"), CASES)
def test_the_engine_stops_its_generation_on_a_signal_and_exits_0(
    start_engine: Callable[[bool], Engine], model_dir: Path, sig: signal.Signals, ignore_sigint: bool
) -> None:
    engine = start_engine(ignore_sigint)
    generate(engine, model_dir.name)
    engine.process.send_signal(sig)
    assert engine.process.wait(timeout=60) == 0, engine.stderr()
    assert_stopped_in_order(engine)
    for client in engine.clients:
        client.join(timeout=60)
    # Each request in flight was ended by the engine, not left to generate its 1900 tokens.
    assert "error" in json.loads(engine.outcomes["stream"]), engine.outcomes
    whole = engine.outcomes["whole"]
    assert isinstance(whole, httpx.Response), engine.outcomes
    assert whole.status_code == 503, whole.text


def assert_stopped_in_order(engine: Engine) -> None:
    stderr = engine.stderr()
    assert ABORT not in stderr
    assert "Traceback" not in stderr
    assert "stopped: the server is closed and the generation thread has ended" in stderr


# -- Ctrl+C on the calc demo ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warm_models(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> Path:
    """``base/`` and ``warm/`` as the demo builds them, with 2 warm-start steps instead of 1150: the
    demo takes them as done and goes straight to GRPO (what it does on a run it continues)."""
    from examples.calc.train import make_splits
    from examples.calc.warm_start import WarmStartConfig, corpus, warm_start

    run_dir = tmp_path_factory.mktemp("demo") / "calc"
    splits = make_splits(0)
    init_model(run_dir / "base", "tiny", seed=0, corpus=corpus(splits["train"]))
    warm_start(run_dir / "base", run_dir / "warm", splits["train"], WarmStartConfig(steps=2, batch_size=4))
    return run_dir


@dataclass
class Demo:
    process: subprocess.Popen[str]
    run_dir: Path
    output: Path

    def text(self) -> str:
        return self.output.read_text()

    def has_rollouts(self, mode: str, status: list[RolloutStatus] | None = None) -> bool:
        """Whether the run's store holds rollouts of ``mode`` (of ``status``, else any), read once
        its services are up."""
        if "model served at" not in self.text():
            return False

        async def read() -> bool:
            store = SqliteStore(self.run_dir / "grpo" / "store.sqlite")
            try:
                return any(r.mode == mode for r in await store.query_rollouts(status=status))
            finally:
                await store.close()

        return asyncio.run(read())

    def validated(self) -> bool:
        metrics = self.run_dir / "grpo" / "metrics.jsonl"
        return metrics.exists() and '"step": 0' in metrics.read_text()


@pytest.fixture
def start_demo(tmp_path: Path) -> Iterator[Callable[[Path], Demo]]:
    started: list[Demo] = []

    def start(run_dir: Path) -> Demo:
        output = tmp_path / "demo.out"
        with output.open("w") as out:
            # A session of its own, as a terminal's foreground job: Ctrl+C is SIGINT to its group.
            process = subprocess.Popen(
                [sys.executable, "-m", "examples.calc.train", "--run-dir", str(run_dir)],
                cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT, text=True,
                start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )  # fmt: skip
        started.append(Demo(process, run_dir, output))
        return started[-1]

    yield start
    for demo in started:
        kill_leftovers(descendants(demo.process.pid))
        demo.process.kill()
        demo.process.wait()


STAGES: dict[str, Callable[[Demo], bool]] = {
    # The SFT loop runs (it logs every 25 steps).
    "warm start": lambda demo: "warm start step 25/" in demo.text(),
    # The validation before the first GRPO step has begun (its rollouts queued or running: on a
    # barely warm model they all end within a second) and has not ended.
    "validation": lambda demo: not demo.validated() and demo.has_rollouts("val"),
    # A GRPO step's rollouts run, after that validation.
    "GRPO": lambda demo: demo.validated() and demo.has_rollouts("train", ["running"]),
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_ctrl_c_on_the_calc_demo_stops_every_process_and_says_how_to_continue(
    start_demo: Callable[[Path], Demo], warm_models: Path, tmp_path: Path, stage: str
) -> None:
    run_dir = tmp_path / "calc"
    if stage != "warm start":
        shutil.copytree(warm_models, run_dir)
    demo = start_demo(run_dir)
    wait_until(lambda: STAGES[stage](demo) or demo.process.poll() is not None, stage)
    assert demo.process.poll() is None, demo.text()
    below = descendants(demo.process.pid)  # every session: the runner pool runs in one of its own
    if stage != "warm start":
        assert any(POOL in (command_line(pid) or "") for pid in below), below

    os.killpg(demo.process.pid, signal.SIGINT)
    left = still_alive_after(below, BOUND_SECONDS)
    left_commands = {pid: command_line(pid) for pid in left}
    kill_leftovers(left)
    assert not left, f"{left_commands}\n{demo.text()}"

    assert demo.process.wait(timeout=60) == 130, demo.text()
    output = demo.text()
    assert ABORT not in output
    assert "Traceback" not in output
    hint = f"interrupted: {run_dir} keeps every stage it finished; to continue, run the demo again with "
    assert f"{hint}--run-dir {run_dir}" in output
    if stage == "warm start":  # what the next run continues from is whole, or absent
        assert (run_dir / "base" / "model.safetensors").is_file()
        assert not (run_dir / "warm").exists()


# -- a parent SIGKILLed -----------------------------------------------------------------------------


def start_parent(kind: str, *arguments: str) -> subprocess.Popen[str]:
    code = f"from tests.reliability.parents import {kind}; {kind}()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *arguments], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True
    )


def test_a_runner_pool_whose_trainer_is_killed_stops_by_itself(tmp_path: Path) -> None:
    parent = start_parent("pool", str(tmp_path))
    below: set[int] = set()
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "pool ready", (tmp_path / "runners.log").read_text()
        below = descendants(parent.pid)
        commands = [command_line(pid) or "" for pid in below]
        assert any(POOL in command for command in commands), commands
        assert any(AGENT_PROGRAM in command for command in commands), commands  # in a session of its own

        parent.kill()
        parent.wait()
        left = still_alive_after(below, BOUND_SECONDS)
        assert not left, (tmp_path / "runners.log").read_text()
        assert "the runner pool's parent process is gone" in (tmp_path / "runners.log").read_text()
    finally:
        kill_leftovers(below)
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("state", ["idle", "generating"])
def test_an_engine_whose_parent_is_killed_stops_by_itself(
    model_dir: Path, tmp_path: Path, state: str
) -> None:
    log = tmp_path / "engine.log"
    parent = start_parent("engine", str(model_dir), str(log), state)
    pid = 0
    try:
        assert parent.stdout is not None
        _, pid_text, url = [*parent.stdout.readline().split(), "", "", ""][:3]
        assert url.startswith("http://"), log.read_text()
        pid = int(pid_text)

        parent.kill()
        parent.wait()
        assert gone_within(pid, BOUND_SECONDS), log.read_text()
        stderr = log.read_text()
        assert "the parent process is gone" in stderr
        assert "stopped: the server is closed and the generation thread has ended" in stderr
        assert ABORT not in stderr
        assert "Traceback" not in stderr
    finally:
        kill_leftovers({pid} if pid else set())
        parent.kill()
        parent.wait()
