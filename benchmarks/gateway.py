"""Gateway overhead: added latency, throughput and CPU per proxied call, vs direct and vs Agent Lightning.

Usage::

    .venv/bin/python benchmarks/gateway.py [--requests 2000] [--seconds 5] [--vs-agentlightning]
                                           [--compare-clients] [--json PATH]

An instant OpenAI-compatible upstream (``fulgor.testing.openai_server``, its own process) answers
every chat call with token ids and logprobs. The same load then runs against it directly and
through each gateway (each in its own process, one rollout per client):

* latency at 1 client: p50 and p99 over ``--requests`` sequential calls, and what the gateway adds;
* requests/s with 32 concurrent clients for ``--seconds``;
* the gateway process's CPU seconds per proxied call (from /proc, user + system), both phases.

fulgor records every call into its store (memory, and SQLite as the embedded default).
``--vs-agentlightning`` runs Agent Lightning 1.0.2's gateway (``agentlightning.gateway``) the same
way; it lives in ``.bench/agentlightning-1.0.2`` (created with ``pip install
--ignore-requires-python agentlightning==1.0.2`` when missing). ``--compare-clients`` measures the
CPU cost per call of the candidate upstream HTTP clients (httpx, aiohttp when installed, fulgor's
own) and JSON codecs in this process.

The load generator is fulgor's lean HTTP/1.1 client, so the client side costs the same for every
target. On a small machine the three processes share the cores: compare figures from one run.
The last line is ``RESULT ...``: with ``--vs-agentlightning`` its ``target_met`` says whether
fulgor's gateway (SQLite store) added at most 1.5 ms to the median call, spent at most a third of
Agent Lightning's CPU per call and served at least twice its requests/s with 32 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _agentlightning_gateway import start_agentlightning
from _offline import go_offline
from fulgor.net.http_client import HttpClient
from store import ensure_agentlightning

ROOT = Path(__file__).resolve().parent.parent
AGL_VERSION = "1.0.2"
CONCURRENCY = 32
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant that uses tools when they help. " * 4},
    {"role": "user", "content": "What is 17 * 23? Think step by step and answer with the number only."},
    {"role": "assistant", "content": "17 * 23 = 391"},
    {"role": "user", "content": "And 391 + 9?"},
]
BODY = json.dumps({"model": "bench", "messages": MESSAGES, "temperature": 0.7, "max_tokens": 32}).encode()
HEADERS = "Content-Type: application/json\r\nAuthorization: Bearer bench-key\r\n"


@dataclass
class Target:
    """Something to send chat calls to: one base URL per client, and the process to charge CPU to."""

    name: str
    bases: list[str]
    pid: int | None


@dataclass
class Result:
    name: str
    p50_ms: float
    p99_ms: float
    rps: float
    cpu_ms_single: float | None
    cpu_ms_concurrent: float | None


# -- load -----------------------------------------------------------------------------------------


def _split(url: str) -> tuple[tuple[str, str, int], str]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return (parts.scheme, parts.hostname or "", parts.port or 80), parts.path.rstrip("/")


async def _call(client: HttpClient, base: str) -> None:
    key, path = _split(base)
    response = await client.request("POST", key, f"{path}/chat/completions", HEADERS, BODY)
    body = await response.read()
    if response.status != 200:
        raise RuntimeError(f"{base} answered {response.status}: {body[:300]!r}")


async def _latencies(base: str, requests: int) -> list[float]:
    client = HttpClient()
    for _ in range(50):
        await _call(client, base)
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        await _call(client, base)
        samples.append(time.perf_counter() - started)
    await client.close()
    return samples


async def _throughput(bases: list[str], seconds: float) -> int:
    client = HttpClient()
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker(base: str) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await _call(client, base)
            done += 1

    await asyncio.gather(*(worker(base) for base in bases[:CONCURRENCY]))
    await client.close()
    return done


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(target: Target, requests: int, seconds: float) -> Result:
    cpu_before = _cpu_seconds(target.pid)
    latencies = asyncio.run(_latencies(target.bases[0], requests))
    cpu_single = _cpu_seconds(target.pid) - cpu_before
    asyncio.run(_throughput(target.bases, 1.0))  # warm the 32 connections
    cpu_before = _cpu_seconds(target.pid)
    count = asyncio.run(_throughput(target.bases, seconds))
    cpu_concurrent = _cpu_seconds(target.pid) - cpu_before
    ms = sorted(sample * 1000 for sample in latencies)
    has_pid = target.pid is not None
    return Result(
        name=target.name,
        p50_ms=statistics.median(ms),
        p99_ms=ms[int(len(ms) * 0.99) - 1],
        rps=count / seconds,
        cpu_ms_single=cpu_single * 1000 / (requests + 50) if has_pid else None,
        cpu_ms_concurrent=cpu_concurrent * 1000 / count if has_pid and count else None,
    )


# -- processes ------------------------------------------------------------------------------------


def _start(command: Sequence[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=ROOT
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise RuntimeError(f"{command[0]} printed nothing; it failed to start")
    return process, line


def start_upstream() -> tuple[subprocess.Popen[str], str]:
    serve = "from fulgor.testing.openai_server import main; raise SystemExit(main())"
    return _start([sys.executable, "-c", serve, "--port", "0"])


def start_fulgor(upstream: str, store: str) -> tuple[subprocess.Popen[str], Target]:
    command = [sys.executable, __file__, "--serve-fulgor", upstream, "--store", store]
    process, line = _start(command)
    info = json.loads(line)
    return process, Target(f"fulgor gateway ({store} store)", info["bases"], process.pid)


def _serve_fulgor(upstream: str, store_kind: str) -> None:
    """Runs in the gateway's own process: a store with one live rollout per client, then the app."""
    import uvicorn

    from fulgor.gateway import GatewayConfig, create_gateway_app
    from fulgor.net.sockets import bind_socket
    from fulgor.store.memory import MemoryStore
    from fulgor.store.sqlite import SqliteStore
    from fulgor.types import RolloutRequest

    directory = tempfile.mkdtemp(prefix="fulgor-gateway-bench-")
    store = MemoryStore() if store_kind == "memory" else SqliteStore(Path(directory) / "store.sqlite")

    async def rollouts() -> list[tuple[str, str]]:
        made = [
            await store.start_rollout(RolloutRequest(input=i), worker_id="bench") for i in range(CONCURRENCY)
        ]
        return [(r.rollout_id, r.attempt.attempt_id) for r in made]

    loop = _new_loop()
    ids = loop.run_until_complete(rollouts())
    app = create_gateway_app(store, [upstream], GatewayConfig(api_key="bench-key"))
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    print(json.dumps({"bases": [f"{url}/r/{rid}/{aid}/v1" for rid, aid in ids]}), flush=True)
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    loop.run_until_complete(uvicorn.Server(config).serve(sockets=[sock]))


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed, as uvicorn (and so ``fulgor gateway``) picks it."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# -- client alternatives --------------------------------------------------------------------------


def compare_clients(upstream: str, requests: int) -> dict[str, float]:
    """CPU milliseconds per call spent in this process by each candidate upstream client."""
    url = f"{upstream}/chat/completions"
    results: dict[str, float] = {}
    candidates: dict[str, Callable[[], Any]] = {"fulgor HttpClient": lambda: _fulgor_client(upstream)}
    candidates["httpx.AsyncClient"] = lambda: _httpx_client(url)
    if importlib.util.find_spec("aiohttp") is not None:
        candidates["aiohttp.ClientSession"] = lambda: _aiohttp_client(url)
    for name, make in candidates.items():
        results[name] = asyncio.run(_client_cpu(make, requests))
    return results


async def _client_cpu(make: Callable[[], Any], requests: int) -> float:
    call, close = await make()
    for _ in range(50):
        await call()
    started = time.process_time()
    for _ in range(requests):
        await call()
    spent = time.process_time() - started
    await close()
    return spent * 1000 / requests


async def _fulgor_client(upstream: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    client = HttpClient()
    return (lambda: _call(client, upstream)), client.close


async def _httpx_client(url: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    import httpx

    client = httpx.AsyncClient()

    async def call() -> None:
        (await client.post(url, content=BODY, headers={"content-type": "application/json"})).read()

    return call, client.aclose


async def _aiohttp_client(url: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    aiohttp: Any = importlib.import_module("aiohttp")
    session = aiohttp.ClientSession()

    async def call() -> None:
        async with session.post(url, data=BODY, headers={"content-type": "application/json"}) as response:
            await response.read()

    return call, session.close


def compare_json(repeats: int = 20000) -> dict[str, float]:
    """Microseconds to parse a typical request body and serialise it back, per codec."""
    import orjson

    results = {}
    for name, loads, dumps in (("json", json.loads, json.dumps), ("orjson", orjson.loads, orjson.dumps)):
        started = time.perf_counter()
        for _ in range(repeats):
            dumps(loads(BODY))
        results[name] = (time.perf_counter() - started) * 1e6 / repeats
    return results


# -- report ---------------------------------------------------------------------------------------


def report(results: list[Result]) -> list[str]:
    direct = results[0]
    lines = [
        f"{'target':<40} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} {'req/s@32':>9} "
        f"{'cpu ms/req (1)':>15} {'cpu ms/req (32)':>16}"
    ]
    for r in results:
        cpu1 = f"{r.cpu_ms_single:.3f}" if r.cpu_ms_single is not None else "-"
        cpu32 = f"{r.cpu_ms_concurrent:.3f}" if r.cpu_ms_concurrent is not None else "-"
        lines.append(
            f"{r.name:<40} {r.p50_ms:>8.3f} {r.p99_ms:>8.3f} {r.p50_ms - direct.p50_ms:>8.3f} "
            f"{r.p99_ms - direct.p99_ms:>8.3f} {r.rps:>9.0f} {cpu1:>15} {cpu32:>16}"
        )
    return lines


# The goal: recording costs the agent little, and far less than Agent Lightning's gateway does.
MAX_ADDED_P50_MS = 1.5
MAX_CPU_VS_AGL = 1 / 3
MIN_RPS_VS_AGL = 2.0


def result_line(results: list[Result]) -> str:
    """``RESULT ...``: what fulgor's gateway adds and spends (SQLite store, the embedded default),
    against the goal; the ratios and ``target_met`` need the Agent Lightning run."""
    direct, sqlite = results[0], next(r for r in results if "sqlite" in r.name)
    added = sqlite.p50_ms - direct.p50_ms
    fields = {
        "added_p50_ms": f"{added:.3f}",
        "cpu_ms_per_call": f"{sqlite.cpu_ms_concurrent or 0:.3f}",
        "rps_32_clients": f"{sqlite.rps:.0f}",
    }
    agl = next((r for r in results if r.name.startswith("Agent Lightning")), None)
    if agl is not None and agl.cpu_ms_concurrent and sqlite.cpu_ms_concurrent:
        cpu_ratio = sqlite.cpu_ms_concurrent / agl.cpu_ms_concurrent
        rps_ratio = sqlite.rps / agl.rps
        met = added <= MAX_ADDED_P50_MS and cpu_ratio <= MAX_CPU_VS_AGL and rps_ratio >= MIN_RPS_VS_AGL
        fields.update(
            cpu_vs_agl=f"{cpu_ratio:.3f}", rps_vs_agl=f"{rps_ratio:.2f}", target_met=str(met).lower()
        )
    return "RESULT " + " ".join(f"{name}={value}" for name, value in fields.items())


def main(argv: Sequence[str] | None = None) -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--vs-agentlightning", action="store_true")
    parser.add_argument("--compare-clients", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--serve-fulgor", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument("--serve-agentlightning", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument("--store", default="memory", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fulgor:
        _serve_fulgor(args.serve_fulgor, args.store)
        return 0
    return run(args)


def run(args: argparse.Namespace) -> int:
    upstream_process, upstream = start_upstream()
    processes: list[subprocess.Popen[Any]] = [upstream_process]
    try:
        results = [
            measure(
                Target("direct (no gateway)", [upstream] * CONCURRENCY, None), args.requests, args.seconds
            )
        ]
        for store in ("memory", "sqlite"):
            process, target = start_fulgor(upstream, store)
            processes.append(process)
            results.append(measure(target, args.requests, args.seconds))
        if args.vs_agentlightning:
            # 1.0.2 declares Python >= 3.12 but runs on 3.11 for its gateway.
            python = ensure_agentlightning(AGL_VERSION, ["--ignore-requires-python"])
            agl_process, bases = start_agentlightning(python, upstream, CONCURRENCY)
            processes.append(agl_process)
            target = Target(f"Agent Lightning {AGL_VERSION} gateway", bases, agl_process.pid)
            results.append(measure(target, args.requests, args.seconds))
        lines = report(results)
        figures: dict[str, Any] = {"results": [r.__dict__ for r in results]}
        if args.compare_clients:
            figures["client_cpu_ms_per_call"] = compare_clients(upstream, args.requests)
            figures["json_us_per_request"] = compare_json()
            lines += [
                f"client CPU ms/call: {name}: {ms:.3f}"
                for name, ms in figures["client_cpu_ms_per_call"].items()
            ]
            lines += [
                f"JSON parse+dump us/request: {k}: {v:.1f}" for k, v in figures["json_us_per_request"].items()
            ]
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
    print("\n".join(lines))
    print(result_line(results))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
