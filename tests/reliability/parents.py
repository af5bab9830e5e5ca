"""Parents for the tests that SIGKILL them: each starts a child that must not outlive it, says on
stdout when that child is in the state to test, and waits to be killed.

``python -c "from tests.reliability.parents import engine; engine()" MODEL LOG idle|generating``
starts ``fulgor engine --parent-fd`` (the read end of a pipe whose write end only this process
holds), its stderr in LOG; with ``generating`` it also streams an answer of many tokens from it. It
prints ``engine PID URL`` once the engine serves (and, generating, runs that answer).

``python -c "from tests.reliability.parents import pool; pool()" RUN_DIR`` serves a SQLite store as
the trainer does (``fulgor serve``'s app on a thread), enqueues one rollout of an agent program
that sleeps for ten minutes, and starts the trainer's runner pool against it
(:class:`~fulgor.training.runners.ProcessRunners`): one runner process running two rollouts at a
time, a long claim long-poll and a grace period far beyond the tests' bounds. It prints ``pool
ready`` once the program runs; the runner's other slot is then waiting in a long-poll claim.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from tests.process_support import command_line, descendants

from fulgor.runner.pool import PoolConfig
from fulgor.runner.worker import RunnerConfig
from fulgor.server import BackgroundServer, ServerConfig, create_app
from fulgor.store import SqliteStore
from fulgor.training.runners import ProcessRunners
from fulgor.types import RolloutConfig, RolloutRequest

AGENT = "tests.integration.sample_agents.slow_agent:sleeping_program"
AGENT_PROGRAM = "time.sleep(json.loads(os.environ['FULGOR_TASK'])"  # in the program's command line
LONG_ANSWER = {
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 1900,  # near the tiny model's context of 2048: seconds of generation
    "ignore_eos": True,
    "stream": True,
}


def engine() -> None:
    model, log, state = sys.argv[1:]
    # This process alone holds the write end (os.pipe's ends are not inherited): it closes when the
    # kernel ends this process, however it ends.
    read, _ = os.pipe()
    command = [sys.executable, "-m", "fulgor.cli.main", "engine", "--model", model, "--port", "0"]
    command += ["--threads", "1", "--parent-fd", str(read)]
    with open(log, "w") as errors:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, pass_fds=(read,)
        )
    os.close(read)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if state == "generating" and url:
        threading.Thread(target=_stream, args=(url, Path(model).name), daemon=True).start()
        _wait_until(lambda: httpx.get(f"{url}/health").json()["running"] == 1)
    print(f"engine {process.pid} {url}", flush=True)
    threading.Event().wait()  # until killed


def _stream(url: str, model: str) -> None:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**LONG_ANSWER, "model": model}) as response:
        for _ in response.iter_lines():
            pass


def pool() -> None:
    run_dir = Path(sys.argv[1])
    store_path = run_dir / "store.sqlite"
    server = BackgroundServer(create_app(ServerConfig(store=SqliteStore(store_path))))
    url = server.start()
    asyncio.run(_enqueue(store_path))
    runner = RunnerConfig(max_concurrency=2, claim_wait_seconds=60, shutdown_grace_seconds=600)
    ProcessRunners(AGENT, url, PoolConfig(n_runners=1, runner=runner), run_dir / "runners.log")
    _wait_until(lambda: any(AGENT_PROGRAM in (command_line(pid) or "") for pid in descendants(os.getpid())))
    print("pool ready", flush=True)
    threading.Event().wait()  # until killed


async def _enqueue(store_path: Path) -> None:
    store = SqliteStore(store_path)  # a connection of its own: the server's belongs to its event loop
    try:
        config = RolloutConfig(timeout_seconds=600)
        await store.enqueue([RolloutRequest(input={"seconds": 600}, config=config)])
    finally:
        await store.close()


def _wait_until(condition: Callable[[], bool], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("the child never reached the state to test")
        time.sleep(0.05)
