"""``fulgor serve`` as its own process: prints its URL, serves the store, refuses what it must,
and shuts down cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fulgor.store import SyncStore
from fulgor.store.client import StoreClient
from fulgor.types import RolloutRequest

SERVE = (sys.executable, "-m", "fulgor.cli.main", "serve")


def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A running ``fulgor serve`` and the URL from the first line of its stdout."""
    process = subprocess.Popen(
        [*SERVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url:
        process.wait(10)
        raise AssertionError(process.stderr.read() if process.stderr else "no URL printed")
    return process, url


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=60, env=env)


def free_after_exit(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_prints_its_url_serves_and_shuts_down_cleanly(tmp_path: Path, stop_signal: int) -> None:
    process, url = start("--port", "0", "--store", f"sqlite:///{tmp_path}/store.sqlite")
    try:
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        assert port != 0
        assert httpx.get(f"{url}/healthz").json()["status"] == "ok"
        with SyncStore(StoreClient(url)) as store:
            (rollout,) = store.enqueue([RolloutRequest(input=1)])
            assert store.get_rollout(rollout.rollout_id).status == "queuing"
    finally:
        process.send_signal(stop_signal)
        returncode = process.wait(15)
    stderr = process.stderr.read() if process.stderr else ""
    assert returncode == 0, stderr
    # The app's own shutdown ran (store closed, gateway flushed), quietly.
    assert "Application shutdown complete" in stderr
    assert "Traceback" not in stderr
    assert free_after_exit(port)
    restarted, url = start("--port", str(port), "--store", f"sqlite:///{tmp_path}/store.sqlite")
    try:
        with SyncStore(StoreClient(url)) as store:
            assert [r.rollout_id for r in store.query_rollouts()] == [rollout.rollout_id]
    finally:
        restarted.terminate()
        restarted.wait(15)


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("--port", str(port), "--store", f"sqlite:///{tmp_path}/store.sqlite")
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"port {port}" in result.stderr
    assert "--port 0" in result.stderr


def test_non_loopback_needs_a_token(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "FULGOR_TOKEN"}
    result = run("--host", "0.0.0.0", "--port", "0", "--store", "memory://", env=env)
    assert result.returncode == 2
    assert "--token-file" in result.stderr
    assert "FULGOR_TOKEN" in result.stderr


def test_token_from_file_wins_over_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {**os.environ, "FULGOR_TOKEN": "from-env"}
    # On loopback: a token, once given, is asked of every client wherever the server listens (and a
    # host beyond loopback is served only with one: test_non_loopback_needs_a_token, check_bind).
    process, local = start("--port", "0", "--store", "memory://", "--token-file", str(token_file), env=env)
    try:
        assert httpx.get(f"{local}/api/v1/stats").status_code == 401
        assert (
            httpx.get(f"{local}/api/v1/stats", headers={"Authorization": "Bearer from-env"}).status_code
            == 403
        )
        assert (
            httpx.get(f"{local}/api/v1/stats", headers={"Authorization": "Bearer from-file"}).status_code
            == 200
        )
    finally:
        process.terminate()
        process.wait(15)


def test_empty_token_file_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("\n")
    result = run("--port", "0", "--store", "memory://", "--token-file", str(token_file))
    assert result.returncode == 2
    assert "is empty" in result.stderr
