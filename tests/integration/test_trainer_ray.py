"""The Trainer with its runners as Ray actors (``Trainer(runners=RayRunners())``): on a Ray instance
the session starts, GRPO trains through them, a runner that dies mid-rollout leaves the rollout to
another, and nothing of Ray outlives the session; on a Ray cluster the test starts as a user starts
one (``ray start --head``), the session joins it by address, serves the actors where
``listen_host`` says, and leaves the cluster running."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray", reason="the ray extra is installed by make test")

import ray
from tests.integration.sample_agents.slow_agent import kills_its_runner_first_time, sleeper
from tests.integration.trainer_support import scripted_trainer

from examples.calc.agent import calc_agent
from examples.calc.dataset import make_splits
from fulgor import GRPO, RayRunners, RolloutConfig, Trainer
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.openai_server import ScriptedOpenAIServer
from fulgor.training.runners import runners_url

pytestmark = pytest.mark.usefixtures("ray_offline")

RAY_PROCESSES = ("ray::", "raylet", "gcs_server")


def ray_processes() -> list[str]:
    """Ray's live processes; a zombie (``<defunct>``: ended, its entry not yet reaped by the parent
    it was handed to, which in a container may be an init that never reaps) runs nothing."""
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [
        line
        for line in listing.splitlines()
        if any(name in line for name in RAY_PROCESSES) and "<defunct>" not in line
    ]


async def attempts_of(path: Path) -> list[list[tuple[str, str]]]:
    """Each rollout's attempts as (status, worker id)."""
    store = SqliteStore(path)
    try:
        found = []
        for rollout in await store.query_rollouts():
            attempts = await store.list_attempts(rollout.rollout_id)
            found.append([(attempt.status, attempt.worker_id or "") for attempt in attempts])
        return found
    finally:
        await store.close()


def test_grpo_trains_through_ray_runner_actors(tmp_path: Path) -> None:
    assert not ray.is_initialized()
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    splits = make_splits(seed=0, sizes=(8, 4, 4))
    trainer = Trainer(
        algorithm=GRPO(group_size=2, batch_tasks=2, max_steps=1, max_tokens=8, val_every=1),
        engine=EngineConfig(model=model, device="cpu"),
        run_dir=tmp_path / "run",
        n_runners=2,
        runners=RayRunners(num_cpus=2),
        progress=False,
    )
    history = trainer.fit(calc_agent, splits["train"], splits["val"][:2])
    assert [m["step"] for m in history] == [0, 1]
    assert (history[1]["rollouts"], history[1]["rollouts_failed"]) == (4, 0)
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "config.json").is_file()
    attempts = asyncio.run(attempts_of(tmp_path / "run" / "store.sqlite"))
    assert len(attempts) == 8  # 2 tasks x 2, and 2 validation rollouts before the step and after it
    assert all(worker.startswith("ray-") for per_rollout in attempts for _, worker in per_rollout)
    assert not ray.is_initialized()  # the session started Ray and shut it down
    assert not ray_processes()


def test_a_runner_that_dies_mid_rollout_leaves_it_to_another(tmp_path: Path) -> None:
    with ScriptedOpenAIServer() as upstream:
        trainer = scripted_trainer(
            upstream,
            tmp_path / "run",
            n_runners=2,
            runners=RayRunners(num_cpus=2),
            rollout_config=RolloutConfig(
                timeout_seconds=120, unresponsive_seconds=3, max_attempts=2, retry_on=("unresponsive",)
            ),
        )
        report = trainer.dev(kills_its_runner_first_time, [{"task": 1}])
    assert [r.status for r in report.rollouts] == ["succeeded"]
    [[(first, dead), (second, alive)]] = asyncio.run(attempts_of(tmp_path / "run" / "store.sqlite"))
    assert (first, second) == ("unresponsive", "succeeded")
    assert dead != alive  # the retry ran on the other actor
    assert not ray.is_initialized()
    assert not ray_processes()


def test_a_ray_the_process_started_is_used_and_left_running(tmp_path: Path) -> None:
    # Ray started by the test process itself, with the path its actors import the agent from.
    path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
    runtime_env = {"env_vars": {"PYTHONPATH": path}}
    ray.init("local", num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
    try:
        with ScriptedOpenAIServer() as upstream:
            trainer = scripted_trainer(upstream, tmp_path / "run", runners=RayRunners())
            report = trainer.dev(sleeper, [{"seconds": 0.01}])
        assert [r.status for r in report.rollouts] == ["succeeded"]
        assert ray.is_initialized()  # not the session's to shut down
    finally:
        ray.shutdown()


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A one-node Ray cluster started as a user starts one (``ray start --head --block``), stopped
    after the test (SIGTERM: the command stops every process it started); its address."""
    port = free_port("127.0.0.1")
    command = [
        str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
        "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
        # Worker ports from the kernel, as a local instance takes them: with a range (the default
        # 10002-19999) the raylet tries each port on every address before it hands it out.
        "--min-worker-port=0", "--max-worker-port=0",
    ]  # fmt: skip
    path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
    env = {**os.environ, "PYTHONPATH": path}
    head = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        assert head.stdout is not None
        said = []
        deadline = time.monotonic() + 180
        while not any("Ray runtime started" in line for line in said):
            assert head.poll() is None, "".join(said)[-3000:]
            assert time.monotonic() < deadline, "".join(said)[-3000:]
            said.append(head.stdout.readline())
        yield f"127.0.0.1:{port}"
        assert head.poll() is None  # the session left the cluster running
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
    deadline = time.monotonic() + 60
    while ray_processes():
        assert time.monotonic() < deadline, ray_processes()
        time.sleep(0.5)
    # `ray start` leaves the address of the cluster it started for ray.init() to find; gone with
    # the cluster, it would only send a later ray.init() to a cluster that ended.
    address_file = Path("/tmp/ray/ray_current_cluster")
    if address_file.is_file() and address_file.read_text().strip().endswith(f":{port}"):
        address_file.unlink()


def test_the_trainer_joins_a_ray_cluster_by_address_and_serves_its_actors_where_it_says(
    tmp_path: Path, ray_cluster: str
) -> None:
    # 127.0.0.2 is this machine too, but not where a session listens by default: rollouts that
    # succeed show the actors reached the session at the address given.
    port = free_port("127.0.0.2")
    # "auto": the cluster this machine runs, as a node of it joins (and with Ray's token
    # authentication, on by default, the token `ray start` saved; an address given as HOST:PORT
    # needs RAY_AUTH_MODE=token in the trainer's environment too, as any Ray driver does).
    assert ray_cluster.startswith("127.0.0.1:")
    runners = RayRunners(
        address="auto", listen_host="127.0.0.2", listen_port=port, server_url=f"http://127.0.0.2:{port}"
    )
    with ScriptedOpenAIServer() as upstream:
        trainer = scripted_trainer(upstream, tmp_path / "run", n_runners=2, runners=runners)
        report = trainer.dev(sleeper, [{"seconds": 0.01}] * 4)
    assert [r.status for r in report.rollouts] == ["succeeded"] * 4
    attempts = asyncio.run(attempts_of(tmp_path / "run" / "store.sqlite"))
    assert all(worker.startswith("ray-") for per_rollout in attempts for _, worker in per_rollout)
    assert not ray.is_initialized()  # the session left the cluster; the fixture checks it still runs


def test_ray_runners_reach_the_session_at_their_server_url() -> None:
    assert (
        runners_url(RayRunners(server_url="http://trainer:8474"), "http://127.0.0.1:1")
        == "http://trainer:8474"
    )
    assert runners_url(RayRunners(), "http://127.0.0.1:1") == "http://127.0.0.1:1"
    assert runners_url(None, "http://127.0.0.1:1") == "http://127.0.0.1:1"
    with pytest.raises(ConfigError, match="needs server_url: the URL the Ray actors reach"):
        RayRunners(listen_host="0.0.0.0")
