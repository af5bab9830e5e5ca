"""The trainer's runner processes: their own session, and a stop that always ends them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from tests.process_support import descendants, gone_within

from fulgor.runner.pool import PoolConfig
from fulgor.runner.worker import RunnerConfig
from fulgor.store import SqliteStore
from fulgor.training.runners import ProcessRunners
from fulgor.types import RolloutRequest

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
