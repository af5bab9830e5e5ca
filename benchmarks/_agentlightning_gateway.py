"""The Agent Lightning side of ``benchmarks/gateway.py``: start its 1.0.2 gateway (``agl-server``).

Its server runs in its own virtual environment (``.bench/agentlightning-1.0.2``); this module only
starts it, registers the upstream as its model server, creates one rollout per client through its
HTTP API and returns the proxy base URL of each
(``/proxy/rollout/{rid}/attempt/{aid}/mode/train/openai/v1``), so the same load can be sent to it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

KEY = "bench-key"
MODEL = "Qwen/Qwen2.5-7B-Instruct"  # its default proxy model name; requests are rewritten to it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _post(url: str, payload: object) -> object:
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _wait_healthy(url: str, process: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"agl-server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("agl-server did not become healthy in time")


def start_agentlightning(
    python: Path, upstream: str, clients: int
) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Agent Lightning's server (its gateway inside) run by ``python``, with ``clients`` rollouts."""
    port = _free_port()
    run_dir = tempfile.mkdtemp(prefix="agl-gateway-bench-")
    command = [str(python), "-m", "agentlightning.server", f"key={KEY}", "host=127.0.0.1", f"port={port}"]
    command += [f"hydra.run.dir={run_dir}", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, process)
    _post(f"{url}/api/models", [{"model": MODEL, "endpoint": upstream}])
    _post(f"{url}/api/rollouts", [{"input": i, "rollout_id": f"bench-{i}"} for i in range(clients)])
    bases = [f"{url}/proxy/rollout/bench-{i}/attempt/a-{i}/mode/train/openai/v1" for i in range(clients)]
    return process, bases
