"""The store benchmark over HTTP: ``fulgor serve`` + ``StoreClient`` against Agent Lightning 0.3.0.

Usage::

    .venv/bin/python benchmarks/store_http.py [--repeats 3] [--rollouts 300] [--latency-samples 1000]

The workload is the one of ``benchmarks/store.py`` (imported from there): N rollouts enqueued in one
call, claimed one at a time by one worker, 10 spans added to each attempt, the attempt marked
succeeded, then a wait for all N. Pass ``A per span`` adds one span per call, pass ``B batched``
all 10 spans of a rollout in one call. Every pass runs against a fresh server process:

* fulgor: ``fulgor serve --port 0`` over a fresh ``sqlite:///`` file, and over ``memory://``, driven
  with ``fulgor.store.client.StoreClient``; the server is stopped with SIGINT afterwards.
* Agent Lightning: ``LightningStoreServer`` over a fresh ``InMemoryLightningStore`` in its own
  process, driven with ``LightningStoreClient`` (``benchmarks/_agentlightning_store_http.py``, run
  with the python of ``.bench/agentlightning-0.3.0``, created when missing), twice: with span
  sequence ids numbered by the worker (one request per span, the fastest it can go), and with the
  store allocating them as fulgor's store does and as Agent Lightning's own tracers have it do
  (``add_otel_span``: a ``get_next_span_sequence_id`` request, then ``add_span``).

Besides the passes, each repetition times ``--latency-samples`` single-span adds one by one on one
attempt of a fresh server (after 20 untimed ones); p50 and p99 are over all repetitions.

Target: fulgor >= 10x Agent Lightning's rollouts/s and spans/s in pass A (medians of
``--repeats``), against its faster, worker-numbered variant. The last line of output is
machine-readable::

    RESULT fulgor_sqlite_vs_agl=<x> fulgor_memory_vs_agl=<x> fulgor_sqlite_vs_agl_store_ids=<x> ...
    span_add_p50_ms=<x> ... target_met=true|false
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from _agentlightning_store import WORKER_ID, task_input
from _offline import go_offline
from fulgor.store.client import StoreClient
from fulgor.types import RolloutRequest
from store import (
    AGL_VERSION,
    PASSES,
    ROOT,
    _make_span,
    _median,
    _workload,
    ensure_agentlightning,
    run_agl_script,
)

AGL_HTTP_SCRIPT = Path(__file__).resolve().parent / "_agentlightning_store_http.py"
TARGET = 10.0
AGL_STORE_IDS = "agl_store_ids"
LATENCY_WARMUP = 20
SERVER_START_SECONDS = 60.0


@dataclass
class Backend:
    key: str  # used in the RESULT line
    label: str
    store_url: Callable[[Path], str] | None  # None: Agent Lightning, run by its own script
    seconds: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in PASSES})
    cpu_seconds: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in PASSES})
    span_add_ms: list[float] = field(default_factory=list)


# -- fulgor side ----------------------------------------------------------------------------------


class FulgorServer:
    """``fulgor serve --port 0 --store STORE_URL`` in a subprocess; ``url`` once it is listening."""

    def __init__(self, store_url: str, log: IO[str]) -> None:
        command = [sys.executable, "-m", "fulgor.cli.main", "serve", "--port", "0", "--store", store_url]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        assert self.process.stdout is not None
        began = time.monotonic()
        line = self.process.stdout.readline().strip()
        if not line.startswith("http"):
            self.stop()
            raise RuntimeError(f"fulgor serve did not print its URL (got {line!r}); see {log.name}")
        if time.monotonic() - began > SERVER_START_SECONDS:
            print(f"fulgor serve took {time.monotonic() - began:.0f}s to start", file=sys.stderr)
        self.url = line

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _with_server(backend: Backend, run: Callable[[StoreClient], Any]) -> Any:
    """Run ``run(client)`` against a fresh ``fulgor serve`` of ``backend``, then stop the server."""
    assert backend.store_url is not None

    async def drive(url: str) -> Any:
        client = StoreClient(url)
        try:
            return await run(client)
        finally:
            await client.close()

    with tempfile.TemporaryDirectory(prefix="fulgor-bench-http-") as name:
        directory = Path(name)
        log_path = directory / "serve.log"
        with log_path.open("w") as log:
            server = FulgorServer(backend.store_url(directory), log)
            try:
                return asyncio.run(drive(server.url))
            except BaseException:
                log.flush()
                print(log_path.read_text()[-4000:], file=sys.stderr)
                raise
            finally:
                server.stop()


async def _span_add_latency(store: StoreClient, samples: int) -> list[float]:
    """Milliseconds of ``samples`` single-span ``add_spans`` calls, after a few untimed ones."""
    await store.enqueue([RolloutRequest(input=task_input(0), mode="train")])
    claimed = await store.claim(WORKER_ID, limit=1)
    if not claimed:
        raise RuntimeError("the rollout enqueued for the latency run could not be claimed")
    rollout_id, attempt_id = claimed[0].rollout_id, claimed[0].attempt.attempt_id
    now = time.time()
    timings: list[float] = []
    gc.collect()
    for j in range(LATENCY_WARMUP + samples):
        span = _make_span(rollout_id, attempt_id, 0, j, now)
        began = time.perf_counter()
        await store.add_spans([span])
        if j >= LATENCY_WARMUP:
            timings.append((time.perf_counter() - began) * 1000)
    return timings


def _fulgor_backends() -> list[Backend]:
    return [
        Backend(
            "fulgor_sqlite",
            "fulgor serve sqlite:/// + StoreClient",
            lambda directory: f"sqlite:///{directory / 'store.sqlite'}",
        ),
        Backend("fulgor_memory", "fulgor serve memory:// + StoreClient", lambda _directory: "memory://"),
    ]


def _run_fulgor_repeat(backend: Backend, rollouts: int, spans_per_rollout: int, latency_samples: int) -> None:
    for name in PASSES:
        batched = name == "batched"
        wall, cpu = _with_server(
            backend,
            lambda client, batched=batched: _workload(client, rollouts, spans_per_rollout, batched),
        )
        backend.seconds[name].append(wall)
        backend.cpu_seconds[name].append(cpu)
    if latency_samples > 0:
        backend.span_add_ms.extend(
            _with_server(backend, lambda client: _span_add_latency(client, latency_samples))
        )


# -- Agent Lightning side -------------------------------------------------------------------------


def _run_agl_repeat(
    python: Path, backend: Backend, rollouts: int, spans_per_rollout: int, latency_samples: int
) -> dict[str, Any]:
    info = run_agl_script(
        python,
        AGL_HTTP_SCRIPT,
        f"--rollouts={rollouts}",
        f"--spans-per-rollout={spans_per_rollout}",
        f"--latency-samples={latency_samples}",
        "--repeats=1",
        *(["--store-sequence-ids"] if backend.key == AGL_STORE_IDS else []),
    )
    for name in PASSES:
        backend.seconds[name].extend(info["seconds"][name])
        backend.cpu_seconds[name].extend(info["cpu_seconds"][name])
    backend.span_add_ms.extend(info["span_add_ms"])
    return info


# -- report ---------------------------------------------------------------------------------------


def _percentile(values: list[float], percent: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def _ratio(agl: Backend, backend: Backend, name: str) -> float:
    """How many times faster ``backend`` is than Agent Lightning (median time over median time)."""
    return _median(agl.seconds[name]) / _median(backend.seconds[name])


def _format_tables(
    backends: list[Backend], agl: Backend, agl_ids: Backend, rollouts: int, spans_per_rollout: int
) -> str:
    header = (
        f"{'backend':<58} {'pass':<24} {'rollouts/s':>11} {'spans/s':>10} {'median s':>9} {'vs AGL':>8} "
        f"{'vs AGL ids':>10} {'client cpu s':>12}  runs (s)"
    )
    lines = [header, "-" * len(header)]
    for name, pass_label in PASSES.items():
        for backend in backends:
            median = _median(backend.seconds[name])
            lines.append(
                f"{backend.label:<58} {pass_label:<24} {rollouts / median:>11.1f} "
                f"{rollouts * spans_per_rollout / median:>10.1f} {median:>9.3f} "
                f"{_ratio(agl, backend, name):>7.2f}x {_ratio(agl_ids, backend, name):>9.2f}x "
                f"{_median(backend.cpu_seconds[name]):>12.3f}  "
                + " ".join(f"{value:.3f}" for value in backend.seconds[name])
            )
    lines.append("")
    header = (
        f"{'single span add (one span, one call)':<58} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
        f"{'samples':>8}"
    )
    lines.extend([header, "-" * len(header)])
    for backend in backends:
        samples = backend.span_add_ms
        mean = statistics.fmean(samples) if samples else float("nan")
        lines.append(
            f"{backend.label:<58} {_percentile(samples, 50):>8.3f} {_percentile(samples, 99):>8.3f} "
            f"{mean:>8.3f} {len(samples):>8}"
        )
    return "\n".join(lines)


def _result_line(fulgor: list[Backend], agl: Backend, agl_ids: Backend, rollouts: int) -> str:
    fields = [f"{backend.key}_vs_agl={_ratio(agl, backend, 'per_span'):.2f}" for backend in fulgor]
    fields += [f"{backend.key}_vs_agl_batched={_ratio(agl, backend, 'batched'):.2f}" for backend in fulgor]
    fields += [
        f"{backend.key}_vs_agl_store_ids={_ratio(agl_ids, backend, 'per_span'):.2f}" for backend in fulgor
    ]
    sqlite = next(backend for backend in fulgor if backend.key == "fulgor_sqlite")
    memory = next(backend for backend in fulgor if backend.key == "fulgor_memory")
    for prefix, backend in (("", sqlite), ("memory_", memory), ("agl_", agl), ("agl_store_ids_", agl_ids)):
        fields.append(f"{prefix}span_add_p50_ms={_percentile(backend.span_add_ms, 50):.3f}")
        fields.append(f"{prefix}span_add_p99_ms={_percentile(backend.span_add_ms, 99):.3f}")
    for backend in (*fulgor, agl, agl_ids):
        fields.append(f"{backend.key}_rollouts_per_s={rollouts / _median(backend.seconds['per_span']):.1f}")
    met = all(_ratio(agl, backend, "per_span") >= TARGET for backend in fulgor)
    fields.append(f"target_met={'true' if met else 'false'}")
    return "RESULT " + " ".join(fields)


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per backend and pass; the median counts")
    parser.add_argument("--rollouts", type=int, default=300, help="rollouts per pass")
    parser.add_argument("--spans-per-rollout", type=int, default=10)
    parser.add_argument(
        "--latency-samples", type=int, default=1000, help="single span adds timed per backend and repetition"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rollouts < 1 or args.spans_per_rollout < 1 or args.latency_samples < 1:
        parser.error("--repeats, --rollouts, --spans-per-rollout and --latency-samples must be at least 1")

    fulgor = _fulgor_backends()
    agl_python = ensure_agentlightning()
    agl = Backend("agl", f"Agent Lightning {AGL_VERSION} LightningStoreServer+Client", None)
    agl_ids = Backend(AGL_STORE_IDS, f"Agent Lightning {AGL_VERSION} server+client, store seq ids", None)
    backends = [*fulgor, agl, agl_ids]
    agl_info: dict[str, dict[str, Any]] = {}

    print(
        f"workload over HTTP: {args.rollouts} rollouts enqueued in one call, claimed one at a time by one "
        f"worker, {args.spans_per_rollout} spans each, attempt marked succeeded, then wait for all; fresh "
        f"server per pass; median of {args.repeats}",
        file=sys.stderr,
    )
    for repeat in range(1, args.repeats + 1):
        for backend in backends:
            began = time.perf_counter()
            if backend.store_url is None:
                agl_info[backend.key] = _run_agl_repeat(
                    agl_python, backend, args.rollouts, args.spans_per_rollout, args.latency_samples
                )
            else:
                _run_fulgor_repeat(backend, args.rollouts, args.spans_per_rollout, args.latency_samples)
            print(
                f"  repeat {repeat}/{args.repeats} {backend.label}: "
                + ", ".join(f"{name} {backend.seconds[name][-1]:.3f}s" for name in PASSES)
                + f" ({time.perf_counter() - began:.1f}s with server starts and latency run)",
                file=sys.stderr,
            )

    print()
    print(_format_tables(backends, agl, agl_ids, args.rollouts, args.spans_per_rollout))
    print()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        "times cover the whole pass (client side, server in its own process); rollouts/s, spans/s and "
        "'vs AGL' use the median wall-clock time; 'client cpu s' is the benchmarking process only"
    )
    for key, info in agl_info.items():
        print(f"{key}: Agent Lightning {info.get('agentlightning')} on python {info.get('python')}:")
        for note in info.get("notes", []):
            print(f"  {note}")
    print(_result_line(fulgor, agl, agl_ids, args.rollouts))


if __name__ == "__main__":
    main()
