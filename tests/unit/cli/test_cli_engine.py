"""``fulgor engine --backend vllm``: Ctrl+C or SIGTERM while vLLM starts stops vLLM too, and so
does a SIGKILL of ``fulgor engine`` itself (vLLM's orphan guard sees its supervisor go)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

STAND_IN = Path(__file__).resolve().parents[1] / "engine" / "vllm_stand_in.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def install_fake_vllm(folder: Path, pid_file: Path) -> None:
    """A ``vllm`` command that writes its process id, then runs the stand-in on another port than
    the one fulgor checks, so it never turns healthy (like a vLLM still loading its model)."""
    script = folder / "vllm"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "argv = sys.argv[1:]\n"
        f"argv[argv.index('--port') + 1] = '{free_port()}'\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"os.execv(sys.executable, [sys.executable, {str(STAND_IN)!r}, *argv])\n"
    )
    script.chmod(0o755)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(condition: Callable[[], bool], timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(
    "stop_signal", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_a_signal_while_vllm_starts_stops_vllm(tmp_path: Path, stop_signal: int) -> None:
    pid_file, launches = tmp_path / "vllm.pid", tmp_path / "launches.jsonl"
    install_fake_vllm(tmp_path, pid_file)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "STAND_IN_LOG": str(launches)}
    command = [sys.executable, "-m", "fulgor.cli.main", "engine", "--backend", "vllm", "--model", "m"]
    process = subprocess.Popen(
        [*command, "--port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pgid = 0
    try:
        # The stand-in logs its launch once it runs (vLLM runs in a process group of its own).
        assert wait_for(lambda: launches.exists() and launches.read_text().strip() != "", 60)
        assert json.loads(launches.read_text().splitlines()[0])["event"] == "launch"
        pgid = os.getpgid(int(pid_file.read_text()))
        assert pgid != os.getpgid(process.pid)
        process.send_signal(stop_signal)
        stdout, stderr = process.communicate(timeout=60)
        assert "Traceback" not in stderr, stderr
        assert process.returncode == (-signal.SIGKILL if stop_signal == signal.SIGKILL else 0), stderr
        assert stdout == ""  # it never served, so it printed no URL
        assert wait_for(lambda: not group_alive(pgid), 15), "vLLM is still running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if pgid and group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def test_vllm_arg_flags_reach_vllm_serve(tmp_path: Path) -> None:
    pid_file, launches = tmp_path / "vllm.pid", tmp_path / "launches.jsonl"
    install_fake_vllm(tmp_path, pid_file)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "STAND_IN_LOG": str(launches)}
    command = [sys.executable, "-m", "fulgor.cli.main", "engine", "--backend", "vllm", "--model", "m"]
    command += ["--port", "0", "--vllm-arg=--enforce-eager", "--vllm-arg=--gpu-memory-utilization=0.5"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pgid = 0
    try:
        assert wait_for(lambda: launches.exists() and launches.read_text().strip() != "", 60)
        pgid = os.getpgid(int(pid_file.read_text()))
        argv = json.loads(launches.read_text().splitlines()[0])["argv"]
        assert argv[:2] == ["serve", "m"]
        assert {"--enforce-eager", "--gpu-memory-utilization=0.5"} <= set(argv)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if pgid and group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
