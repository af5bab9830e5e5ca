"""``fulgor gateway`` as its own process: prints its URL, records into a SQLite store, refuses to
bind beyond loopback without the run's key."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx

from fulgor import semconv
from fulgor.store.sqlite import SqliteStore
from fulgor.testing import ScriptedOpenAIServer
from fulgor.types import ModelCall, RolloutRequest


def start_gateway(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "fulgor.cli.main", "gateway", "--port", "0", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_the_gateway_process_records_into_the_store(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path}/store.sqlite"
    store = SqliteStore(tmp_path / "store.sqlite")
    rollout = await store.start_rollout(RolloutRequest(input=1), worker_id="w")
    async with ScriptedOpenAIServer() as upstream:
        process = start_gateway("--store", store_url, "--upstream", upstream.url, "--model-version", "3")
        try:
            assert process.stdout is not None
            url = (await asyncio.to_thread(process.stdout.readline)).strip()
            assert url.startswith("http://127.0.0.1:"), process.stderr.read() if process.stderr else ""
            base = f"{url}/r/{rollout.rollout_id}/{rollout.attempt.attempt_id}/v1"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with httpx.AsyncClient(timeout=10) as http:
                response = await http.post(f"{base}/chat/completions", json=body)
            assert response.status_code == 200
        finally:
            process.terminate()
            await asyncio.to_thread(process.wait, 10)
    spans = await store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL)
    [call] = [ModelCall.model_validate(span.attributes[semconv.ATTR_MODEL_CALL]) for span in spans]
    assert call.response_token_ids == upstream.samples[0].token_ids
    assert call.model_version == 3
    await store.close()


def test_binding_beyond_loopback_needs_the_key(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "fulgor.cli.main", "gateway", "--host", "0.0.0.0", "--port", "0"),
            *("--store", f"sqlite:///{tmp_path}/s.sqlite", "--upstream", "http://127.0.0.1:1/v1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "needs the run's key" in result.stderr


def test_the_gateway_closes_its_store_when_it_stops(tmp_path: Path) -> None:
    noting_close = (
        "import sys\n"
        "from fulgor.store.sqlite import SqliteStore\n"
        "close = SqliteStore.close\n"
        "async def noting_close(self):\n"
        "    print('store closed', file=sys.stderr, flush=True)\n"
        "    await close(self)\n"
        "SqliteStore.close = noting_close\n"
        "from fulgor.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    command = [
        sys.executable,
        "-c",
        noting_close,
        "gateway",
        "--port",
        "0",
        "--upstream",
        "http://127.0.0.1:1/v1",
    ]
    process = subprocess.Popen(
        [*command, "--store", f"sqlite:///{tmp_path}/store.sqlite"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), process.stderr.read() if process.stderr else ""
        assert httpx.get(f"{url}/gateway/state", timeout=10).status_code == 200  # serving, signals handled
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert stderr.splitlines().count("store closed") == 1
