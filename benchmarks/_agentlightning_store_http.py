"""The Agent Lightning side of ``benchmarks/store_http.py``: the store workload over HTTP.

Run with the python of the ``.bench/agentlightning-0.3.0`` virtual environment (never fulgor's). It
starts a second copy of itself as the server process (``--serve``), which holds one
``LightningStoreServer`` per pass, each wrapping a fresh ``InMemoryLightningStore`` on its own
loopback port, and drives them from this process with ``LightningStoreClient``. The server process
stops when its stdin closes. One JSON object is printed on stdout::

    {"agentlightning": "0.3.0", "rollouts": 300, "spans_per_rollout": 10,
     "seconds": {"per_span": [..], "batched": [..]}, "cpu_seconds": {..},
     "span_add_ms": [..], "notes": [..]}

The workload and its mapping onto Agent Lightning's API are those of
``benchmarks/_agentlightning_store.py``, with two differences forced by ``LightningStoreClient``:

* ``add_many_spans`` sends one ``POST /spans`` request per span (the HTTP API has no batch route),
  so pass ``batched`` makes as many requests as pass ``per_span``;
* ``wait_for_rollouts`` refuses a timeout above 0.1 s, so waiting is a loop of 0.1 s waits until
  every rollout has finished (one call here, since all attempts already succeeded).

``span_add_ms`` are single ``add_span`` calls timed one by one on one attempt of a fresh store.

With ``--store-sequence-ids`` the store allocates each span's sequence id, as Agent Lightning's own
tracers have it do (``add_otel_span`` without a sequence id): over HTTP that is a
``get_next_span_sequence_id`` request before each ``add_span`` (and before each span of a batch),
and the timed single add is that pair.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from _agentlightning_store import (
    PASSES,
    WORKER_ID,
    agl_span_factory,
    run_agl_workload,
    task_input,
)

LATENCY_WARMUP = 20


# -- server process -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _serve(count: int) -> None:
    """Start ``count`` servers, print their URLs as one JSON line, serve until stdin closes."""
    from agentlightning.store import InMemoryLightningStore
    from agentlightning.store.client_server import LightningStoreServer

    servers = []
    for _ in range(count):
        server = LightningStoreServer(
            InMemoryLightningStore(), host="127.0.0.1", port=_free_port(), launch_mode="asyncio"
        )
        await server.start()
        servers.append(server)
    print(json.dumps({"urls": [server.endpoint for server in servers]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for server in servers:
        await server.stop()


class ServerProcess:
    """The ``--serve`` process: ``count`` fresh stores, one URL each."""

    def __init__(self, count: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), f"--serve={count}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._urls: list[str] | None = None

    def urls(self) -> list[str]:
        if self._urls is None:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"Agent Lightning server exited early ({self.process.wait()})")
            self._urls = list(json.loads(line)["urls"])
        return self._urls

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- client side ----------------------------------------------------------------------------------


async def _run_pass(
    url: str, rollouts: int, spans_per_rollout: int, batched: bool, store_ids: bool
) -> tuple[float, float]:
    from agentlightning.store.client_server import LightningStoreClient

    store = LightningStoreClient(url)
    try:
        return await run_agl_workload(store, rollouts, spans_per_rollout, batched, store_ids)
    finally:
        await store.close()


async def _span_add_latency(url: str, samples: int, store_ids: bool) -> list[float]:
    """Milliseconds of ``samples`` single span adds, after a few untimed ones."""
    from agentlightning.store.client_server import LightningStoreClient
    from agentlightning.types import EnqueueRolloutRequest

    store = LightningStoreClient(url)
    make_span = agl_span_factory()
    try:
        await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=task_input(0), mode="train")])
        claimed = await store.dequeue_rollout(worker_id=WORKER_ID)
        if claimed is None:
            raise RuntimeError("the rollout enqueued for the latency run could not be claimed")
        rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
        now = time.time()
        timings: list[float] = []
        gc.collect()
        for j in range(LATENCY_WARMUP + samples):
            elapsed = 0.0
            sequence_id = j + 1
            if store_ids:
                began = time.perf_counter()
                sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
                elapsed = time.perf_counter() - began
            span = make_span(rollout_id, attempt_id, 0, j, now, sequence_id)
            began = time.perf_counter()
            await store.add_span(span)
            elapsed += time.perf_counter() - began
            if j >= LATENCY_WARMUP:
                timings.append(elapsed * 1000)
        return timings
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=300)
    parser.add_argument("--spans-per-rollout", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--latency-samples", type=int, default=1000, help="0 skips the latency run")
    parser.add_argument(
        "--store-sequence-ids",
        action="store_true",
        help="have the store allocate span sequence ids, as Agent Lightning's tracers do",
    )
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve))
        return

    from importlib.metadata import version

    seconds: dict[str, list[float]] = {name: [] for name in PASSES}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in PASSES}
    span_add_ms: list[float] = []
    for _ in range(args.repeats):
        server = ServerProcess(len(PASSES) + 1)
        try:
            urls = server.urls()
            for url, name in zip(urls[: len(PASSES)], PASSES, strict=True):
                wall, cpu = asyncio.run(
                    _run_pass(
                        url, args.rollouts, args.spans_per_rollout, name == "batched", args.store_sequence_ids
                    )
                )
                seconds[name].append(wall)
                cpu_seconds[name].append(cpu)
            if args.latency_samples > 0:
                span_add_ms.extend(
                    asyncio.run(_span_add_latency(urls[-1], args.latency_samples, args.store_sequence_ids))
                )
        finally:
            server.stop()
    result: dict[str, Any] = {
        "agentlightning": version("agentlightning"),
        "python": sys.version.split()[0],
        "rollouts": args.rollouts,
        "spans_per_rollout": args.spans_per_rollout,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "span_add_ms": span_add_ms,
        "notes": [
            "LightningStoreServer(InMemoryLightningStore(), launch_mode='asyncio') in its own process, "
            "driven by LightningStoreClient: enqueue_many_rollouts / dequeue_rollout / add_span / "
            "add_many_spans / update_attempt / wait_for_rollouts",
            "add_many_spans over HTTP is one POST /spans per span (no batch route): pass B makes as many "
            "span requests as pass A",
            "wait_for_rollouts over HTTP refuses timeouts above 0.1 s: waiting is a loop of 0.1 s waits",
            (
                "span sequence ids allocated by the store: get_next_span_sequence_id before each add_span, "
                "as its tracers' add_otel_span does over HTTP"
                if args.store_sequence_ids
                else "span sequence ids assigned by the worker (1..N), not allocated by the store"
            ),
        ],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
