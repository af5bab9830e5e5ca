"""The trainer's runner processes: their own session, a stop that always ends them, and another
Python to run them on, checked before they start."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.process_support import descendants, gone_within

import fulgor
from fulgor.errors import ConfigError
from fulgor.runner.pool import PoolConfig
from fulgor.runner.worker import RunnerConfig
from fulgor.store import SqliteStore
from fulgor.training.runners import ProcessRunners, check_runner_python, runner_path
from fulgor.types import RolloutRequest
from fulgor.version import __version__

AGENT = "tests.integration.sample_agents.slow_agent:sleeper"
PROGRAM = "tests.integration.sample_agents.slow_agent:sleeping_program"


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def pool_config() -> PoolConfig:
    return PoolConfig(n_runners=1, runner=RunnerConfig(claim_wait_seconds=0.2, shutdown_grace_seconds=30))


async def running(store: SqliteStore, rollout_id: str, seconds: float) -> bool:
    deadline = asyncio.get_running_loop().time() + seconds
    while (await store.get_rollout(rollout_id)).status == "queuing":
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def proc_file(pid: int, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()


def program_running() -> bool:
    """Whether a zero-code agent's program (``sleeping_program``) runs below this process."""
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            if b"time.sleep" in proc_file(pid, "cmdline"):
                return True
    return False


async def program_started(seconds: float) -> bool:
    deadline = asyncio.get_running_loop().time() + seconds
    while not program_running():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


@pytest.mark.parametrize("agent", [AGENT, PROGRAM])
async def test_the_pool_runs_in_its_own_session_and_a_cancelled_stop_still_ends_it(
    tmp_path: Path, agent: str
) -> None:
    before = open_descriptors()
    store = SqliteStore(tmp_path / "store.sqlite")
    [sleeping] = await store.enqueue([RolloutRequest(input={"seconds": 60})])
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    runners = ProcessRunners(agent, store_url, pool_config(), tmp_path / "logs" / "runners.log")
    [pool] = list(descendants(os.getpid()))
    # A Ctrl+C sent to the terminal's process group does not reach it: only the trainer stops it.
    assert os.getsid(pool) == pool
    assert os.getpgid(pool) != os.getpgrp()
    assert await running(store, sleeping.rollout_id, 60), (tmp_path / "logs" / "runners.log").read_text()
    if agent == PROGRAM:  # in a session of its own: killing the pool's session would not end it
        assert await program_started(60), (tmp_path / "logs" / "runners.log").read_text()
    started = descendants(os.getpid())

    stopping = asyncio.create_task(runners.stop())
    await asyncio.sleep(0.05)
    stopping.cancel()  # a second Ctrl+C while the pool drains (its rollout has 30s of grace)
    with pytest.raises(asyncio.CancelledError):
        await stopping

    assert all(gone_within(pid, 5) for pid in started), started
    await store.close()
    assert open_descriptors() == before  # the pipe to the pool is closed too


def test_a_log_folder_that_cannot_be_made_leaks_no_descriptor(tmp_path: Path) -> None:
    (tmp_path / "logs").write_text("a file where the log folder should be")
    before = open_descriptors()
    with pytest.raises(NotADirectoryError):
        ProcessRunners(
            AGENT, "sqlite:///unused.sqlite", pool_config(), tmp_path / "logs" / "x" / "runners.log"
        )
    assert open_descriptors() == before


async def test_the_operator_key_reaches_the_pool_in_its_environment_not_on_its_command_line(
    tmp_path: Path,
) -> None:
    config = PoolConfig(n_runners=1, runner=RunnerConfig(claim_wait_seconds=0.2, operator_key="run-secret"))
    runners = ProcessRunners(AGENT, f"sqlite:///{tmp_path / 's.sqlite'}", config, tmp_path / "runners.log")
    try:
        [pool] = list(descendants(os.getpid()))
        assert b"run-secret" not in proc_file(pool, "cmdline")  # ps shows it to everyone
        assert b"FULGOR_TOKEN=run-secret\0" in proc_file(pool, "environ")
    finally:
        await runners.stop()


def test_the_trainer_takes_ray_runners_or_none_and_says_so_otherwise() -> None:
    from fulgor import GRPO, ConfigError, RayRunners, Trainer

    assert (
        Trainer(algorithm=GRPO(), upstream="http://127.0.0.1:9/v1", runners=RayRunners()).runners
        == RayRunners()
    )
    with pytest.raises(
        ConfigError,
        match=r"runners must be None \(local processes\), fulgor\.RayRunners\(\.\.\.\) or fulgor\.Kub",
    ):
        Trainer(algorithm=GRPO(), upstream="http://127.0.0.1:9/v1", runners="ray")  # type: ignore[arg-type]


def test_kubernetes_runners_refuse_what_cannot_run_as_jobs() -> None:
    from tests.integration.sample_agents.slow_agent import sleeper

    from fulgor import ConfigError, KubernetesRunners, SubprocessAgent
    from fulgor.store.memory import MemoryStore

    with pytest.raises(ConfigError, match="run 'Calc_1' must be 1-40 lower-case letters"):
        KubernetesRunners(template="", run="Calc_1")
    with pytest.raises(ConfigError, match="the session needs server_url"):
        KubernetesRunners(template="", run="calc", listen_host="0.0.0.0")
    runners = KubernetesRunners(template="", run="calc")
    config = RunnerConfig(operator_key="key")
    graded = SubprocessAgent(["true"], reward_fn=lambda result: 1.0)

    async def start(agent: object) -> None:
        await runners.start(agent, MemoryStore(), "http://127.0.0.1:9", 1, config)  # type: ignore[arg-type]

    with pytest.raises(ConfigError, match=r"Kubernetes Jobs run a program: pass a fulgor\.SubprocessAgent"):
        asyncio.run(start(sleeper))
    with pytest.raises(ConfigError, match=r"post the reward from the program to \$FULGOR_REWARD_URL"):
        asyncio.run(start(graded))


def test_runner_python_must_be_an_executable_file_and_no_ray(tmp_path: Path) -> None:
    from fulgor import GRPO, ConfigError, RayRunners, Trainer

    (tmp_path / "python").write_text("not executable")
    for python in (tmp_path / "missing", tmp_path / "python"):
        with pytest.raises(ConfigError, match="is not an executable file: give the Python of the agent"):
            Trainer(algorithm=GRPO(), upstream="http://127.0.0.1:9/v1", runner_python=python)
    with pytest.raises(ConfigError, match="cannot go with RayRunners"):
        Trainer(
            algorithm=GRPO(),
            upstream="http://127.0.0.1:9/v1",
            runner_python=sys.executable,
            runners=RayRunners(),
        )


def test_another_python_gets_the_trainers_sources_but_not_its_packages() -> None:
    site_packages = [entry for entry in sys.path if entry.endswith("site-packages")]
    assert site_packages
    own = runner_path(foreign=False).split(os.pathsep)
    foreign = runner_path(foreign=True).split(os.pathsep)
    assert all(entry in own for entry in site_packages)
    assert not any(entry in foreign for entry in site_packages)
    assert not any(entry.startswith(sys.base_prefix) for entry in foreign)  # nor its standard library
    assert str(Path(fulgor.__file__).parents[1]) in foreign  # this fulgor, from its source tree
    assert os.getcwd() in foreign


def test_a_python_without_fulgors_requirements_is_a_clear_error_and_starts_nothing(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    before = open_descriptors()
    with pytest.raises(ConfigError) as raised:
        ProcessRunners(
            AGENT,
            "sqlite:///unused.sqlite",
            pool_config(),
            tmp_path / "runners.log",
            python=str(tmp_path / "bare" / "bin" / "python"),
        )
    message = str(raised.value)
    assert "cannot run fulgor's runners (ModuleNotFoundError: No module named" in message
    assert f"install fulgor {__version__} in its environment" in message
    assert not descendants(os.getpid())
    assert open_descriptors() == before


def test_a_runner_python_that_cannot_load_the_agent_or_has_another_fulgor(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot load the agent: cannot import 'tests\.no_such_agent'"):
        check_runner_python(
            sys.executable, "tests.no_such_agent:agent", {**os.environ, "PYTHONPATH": runner_path(True)}
        )
    older = tmp_path / "python"  # answers the check as a Python with fulgor 0.0.1 would
    older.write_text("#!/bin/sh\necho 0.0.1\n")
    older.chmod(0o755)
    with pytest.raises(ConfigError, match=rf"has fulgor 0\.0\.1, the trainer {__version__}: install fulgor"):
        check_runner_python(str(older), AGENT, os.environ)


@pytest.fixture
def other_python(tmp_path: Path) -> Path:
    """Another interpreter: a virtual environment of its own whose packages are the trainer's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    packages = [entry for entry in sys.path if entry.endswith("site-packages")]
    Path(site, "trainer.pth").write_text("\n".join(packages) + "\n")
    return python


async def test_the_pool_runs_on_the_runner_python(tmp_path: Path, other_python: Path) -> None:
    store = SqliteStore(tmp_path / "store.sqlite")
    [request] = await store.enqueue([RolloutRequest(input={"seconds": 0})])
    python = other_python
    runners = ProcessRunners(
        AGENT,
        f"sqlite:///{tmp_path / 'store.sqlite'}",
        pool_config(),
        tmp_path / "runners.log",
        python=str(python),
    )
    try:
        [pool] = [
            pid for pid in descendants(os.getpid()) if b"fulgor.training._pool" in proc_file(pid, "cmdline")
        ]
        assert proc_file(pool, "cmdline").split(b"\0")[0] == str(python).encode()
        assert await running(store, request.rollout_id, 60), (tmp_path / "runners.log").read_text()
    finally:
        await runners.stop()
        await store.close()
