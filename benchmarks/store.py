"""Store throughput: fulgor's MemoryStore and SqliteStore, optionally against Agent Lightning 0.3.0.

Usage::

    .venv/bin/python benchmarks/store.py [--vs-agentlightning] [--repeats 3] [--rollouts 2000]

The workload, run once per pass on a fresh store (a fresh file in a temporary directory for
SQLite): N rollouts are enqueued in one call, then one worker claims them one at a time, adds 10
spans to each attempt and marks the attempt succeeded; finally it waits for all N rollouts. Two
passes differ only in how spans arrive:

* ``A per span``: one ``add_spans`` call per span, as a tracer exporting spans one by one does;
* ``B batched``: one ``add_spans`` call with all 10 spans of the rollout.

The whole pass is timed (enqueue, claims, spans, updates, wait), each backend and pass is repeated
``--repeats`` times, and the median time gives rollouts/s and spans/s. Repetitions are interleaved
across backends so that noise from other work on the machine spreads over all of them.

``--vs-agentlightning`` also runs the same workload against Agent Lightning 0.3.0's
``InMemoryLightningStore`` (see ``benchmarks/_agentlightning_store.py`` for how each operation maps
onto its API). It runs in its own virtual environment, ``.bench/agentlightning-0.3.0`` (created with
``pip install agentlightning==0.3.0`` when missing), in a subprocess once per repetition.

Targets (pass A, medians): MemoryStore >= 5x Agent Lightning's in-memory store, SqliteStore with its
default (durable) settings >= 2x. The last line of output is machine-readable::

    RESULT memory_vs_agl=<x> sqlite_vs_agl=<x> ...
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _agentlightning_store import (
    SPAN_NAMES,
    WAIT_TIMEOUT_SECONDS,
    WORKER_ID,
    parent_id,
    span_attributes,
    span_id,
    span_times,
    task_input,
    trace_id,
)
from _offline import go_offline
from fulgor.store.base import Store
from fulgor.store.memory import MemoryStore
from fulgor.types import RolloutRequest, Span, SpanStatus

ROOT = Path(__file__).resolve().parent.parent
AGL_VERSION = "0.3.0"
AGL_SCRIPT = Path(__file__).resolve().parent / "_agentlightning_store.py"
AGL_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
PASSES = {"per_span": "A one call per span", "batched": "B one call per rollout"}
TARGETS = {"memory": 5.0, "sqlite": 2.0}


@dataclass
class Backend:
    key: str  # used in the RESULT line
    label: str
    open: Callable[[Path], Store] | None  # None: runs outside this process (Agent Lightning)
    seconds: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in PASSES})
    cpu_seconds: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in PASSES})


# -- fulgor side ----------------------------------------------------------------------------------


def _make_span(rollout_id: str, attempt_id: str, i: int, j: int, now: float) -> Span:
    start, end = span_times(j, now)
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id=trace_id(i),
        span_id=span_id(i, j),
        parent_id=parent_id(i, j),
        name=SPAN_NAMES[j % len(SPAN_NAMES)],
        start_time=start,
        end_time=end,
        attributes=span_attributes(i, j),
        status=SpanStatus(code="ok"),
    )


async def _workload(
    store: Store, rollouts: int, spans_per_rollout: int, batched: bool
) -> tuple[float, float]:
    """Run one pass against ``store``; returns the wall-clock and CPU seconds it took."""
    requests = [RolloutRequest(input=task_input(i), mode="train") for i in range(rollouts)]
    gc.collect()
    began, began_cpu = time.perf_counter(), time.process_time()
    enqueued = await store.enqueue(requests)
    for i in range(rollouts):
        claimed = await store.claim(WORKER_ID, limit=1)
        if not claimed:
            raise RuntimeError(f"queue empty after {i} of {rollouts} claims")
        rollout_id, attempt_id = claimed[0].rollout_id, claimed[0].attempt.attempt_id
        now = time.time()
        if batched:
            await store.add_spans(
                [_make_span(rollout_id, attempt_id, i, j, now) for j in range(spans_per_rollout)]
            )
        else:
            for j in range(spans_per_rollout):
                await store.add_spans([_make_span(rollout_id, attempt_id, i, j, now)])
        await store.update_attempt(rollout_id, attempt_id, status="succeeded")
    done = await store.wait(
        [rollout.rollout_id for rollout in enqueued], timeout_seconds=WAIT_TIMEOUT_SECONDS
    )
    elapsed, cpu = time.perf_counter() - began, time.process_time() - began_cpu

    # Check, outside the timed part, that the workload really happened.
    if len(done) != rollouts or any(rollout.status != "succeeded" for rollout in done):
        raise RuntimeError(f"only {len(done)} of {rollouts} rollouts finished")
    stats = await store.stats()
    if stats.spans != rollouts * spans_per_rollout or stats.rollouts != {"succeeded": rollouts}:
        raise RuntimeError(f"unexpected store contents after the pass: {stats}")
    return elapsed, cpu


def _run_fulgor_pass(
    backend: Backend, rollouts: int, spans_per_rollout: int, batched: bool
) -> tuple[float, float]:
    assert backend.open is not None

    async def run(directory: Path) -> tuple[float, float]:
        store = backend.open(directory)
        try:
            return await _workload(store, rollouts, spans_per_rollout, batched)
        finally:
            await store.close()

    with tempfile.TemporaryDirectory(prefix="fulgor-bench-") as directory:
        return asyncio.run(run(Path(directory)))


def _fulgor_backends() -> tuple[list[Backend], list[str]]:
    backends = [Backend("memory", "fulgor MemoryStore", lambda _directory: MemoryStore())]
    notes: list[str] = []
    try:
        from fulgor.store.sqlite import SqliteStore
    except ImportError as error:
        notes.append(f"SqliteStore skipped: {error}")
        return backends, notes

    def opener(**kwargs: Any) -> Callable[[Path], Store]:
        return lambda directory: SqliteStore(directory / "store.db", **kwargs)

    parameter = inspect.signature(SqliteStore).parameters.get("synchronous")
    if parameter is None:
        backends.append(Backend("sqlite", "fulgor SqliteStore", opener()))
        return backends, notes
    default = parameter.default if parameter.default is not inspect.Parameter.empty else "?"
    backends.append(Backend("sqlite", f"fulgor SqliteStore (synchronous={default})", opener()))
    if default != "FULL":
        backends.append(
            Backend("sqlite_full", "fulgor SqliteStore (synchronous=FULL)", opener(synchronous="FULL"))
        )
    return backends, notes


# -- Agent Lightning side -------------------------------------------------------------------------


def _agl_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(AGL_ENV)
    return env


def ensure_agentlightning(version: str = AGL_VERSION, pip_options: Sequence[str] = ()) -> Path:
    """The python of ``.bench/agentlightning-VERSION``, a virtual environment with that version of
    agentlightning, created when missing (``pip_options`` go to its ``pip install``)."""
    venv = ROOT / ".bench" / f"agentlightning-{version}"
    python = venv / "bin" / "python"
    if _installed_version(python) == version:
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    log_path = venv.parent / f"agl-{version}-install.log"
    print(f"installing agentlightning=={version} into {venv} (log: {log_path}) ...", file=sys.stderr)
    base_python = shutil.which("python3") or sys.executable
    with log_path.open("w") as log:
        for command in (
            [base_python, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "--upgrade", "pip"],
            [str(python), "-m", "pip", "install", *pip_options, f"agentlightning=={version}"],
        ):
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=_agl_env(), check=True)
    if _installed_version(python) != version:
        raise RuntimeError(f"agentlightning=={version} is not importable in {venv}; see {log_path}")
    return python


def _installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('agentlightning'))"],
        capture_output=True,
        text=True,
        env=_agl_env(),
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def _run_agl(python: Path, rollouts: int, spans_per_rollout: int) -> dict[str, Any]:
    return run_agl_script(
        python,
        AGL_SCRIPT,
        f"--rollouts={rollouts}",
        f"--spans-per-rollout={spans_per_rollout}",
        "--repeats=1",
    )


def run_agl_script(python: Path, script: Path, *arguments: str) -> dict[str, Any]:
    """Run an Agent Lightning side script in its own environment; its last JSON line, parsed."""
    command = [str(python), str(script), *arguments]
    done = subprocess.run(command, capture_output=True, text=True, env=_agl_env(), cwd=ROOT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Agent Lightning run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(
            f"Agent Lightning run printed no JSON:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# -- report ---------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _format_table(backends: list[Backend], agl: Backend | None, rollouts: int, spans_per_rollout: int) -> str:
    header = (
        f"{'backend':<44} {'pass':<24} {'rollouts/s':>11} {'spans/s':>10} {'median s':>9} {'vs AGL':>7} "
        f"{'cpu s':>8} {'vs AGL cpu':>10}  runs (s)"
    )
    lines = [header, "-" * len(header)]
    for name, pass_label in PASSES.items():
        for backend in backends:
            runs = backend.seconds[name]
            if not runs:
                continue
            median, cpu = _median(runs), _median(backend.cpu_seconds[name])
            ratio = f"{_ratio(agl, backend, name):6.2f}x" if agl is not None else f"{'-':>7}"
            cpu_ratio = f"{_ratio(agl, backend, name, cpu=True):9.2f}x" if agl is not None else f"{'-':>10}"
            lines.append(
                f"{backend.label:<44} {pass_label:<24} {rollouts / median:>11.1f} "
                f"{rollouts * spans_per_rollout / median:>10.1f} {median:>9.3f} {ratio} "
                f"{cpu:>8.3f} {cpu_ratio}  " + " ".join(f"{value:.3f}" for value in runs)
            )
    return "\n".join(lines)


def _ratio(agl: Backend, backend: Backend, name: str, *, cpu: bool = False) -> float:
    """How many times faster ``backend`` is than Agent Lightning (median time over median time)."""
    if cpu:
        return _median(agl.cpu_seconds[name]) / _median(backend.cpu_seconds[name])
    return _median(agl.seconds[name]) / _median(backend.seconds[name])


def _result_line(backends: list[Backend], agl: Backend | None, rollouts: int) -> str:
    fields: list[str] = []
    fulgor = [backend for backend in backends if backend is not agl]
    suffixes = {"per_span": "", "batched": "_batched"}
    if agl is None:
        for backend in fulgor:
            for name, suffix in suffixes.items():
                per_second = rollouts / _median(backend.seconds[name])
                fields.append(f"{backend.key}_rollouts_per_s{suffix}={per_second:.1f}")
        return "RESULT " + " ".join(fields)
    for name, suffix in suffixes.items():
        fields.extend(f"{backend.key}_vs_agl{suffix}={_ratio(agl, backend, name):.2f}" for backend in fulgor)
    fields.extend(
        f"{backend.key}_vs_agl_cpu={_ratio(agl, backend, 'per_span', cpu=True):.2f}" for backend in fulgor
    )
    for name, suffix in suffixes.items():
        fields.append(f"agl_rollouts_per_s{suffix}={rollouts / _median(agl.seconds[name]):.1f}")
    for backend in fulgor:
        if backend.key in TARGETS:
            met = _ratio(agl, backend, "per_span") >= TARGETS[backend.key]
            fields.append(f"{backend.key}_target={'met' if met else 'missed'}")
    return "RESULT " + " ".join(fields)


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vs-agentlightning",
        action="store_true",
        help=f"also run Agent Lightning {AGL_VERSION}'s InMemoryLightningStore (installed into .bench/)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per backend and pass; the median counts")
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts per pass")
    parser.add_argument("--spans-per-rollout", type=int, default=10)
    parser.add_argument(
        "--backends",
        default="",
        help="comma-separated subset of memory,sqlite,sqlite_full (default: all available)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rollouts < 1 or args.spans_per_rollout < 1:
        parser.error("--repeats, --rollouts and --spans-per-rollout must be at least 1")

    backends, notes = _fulgor_backends()
    if args.backends:
        wanted = set(args.backends.split(","))
        backends = [backend for backend in backends if backend.key in wanted]
    agl: Backend | None = None
    agl_python: Path | None = None
    agl_info: dict[str, Any] = {}
    if args.vs_agentlightning:
        agl_python = ensure_agentlightning()
        agl = Backend("agl", f"Agent Lightning {AGL_VERSION} InMemoryLightningStore", None)
        backends.append(agl)

    print(
        f"workload: {args.rollouts} rollouts enqueued in one call, claimed one at a time by one worker, "
        f"{args.spans_per_rollout} spans each, attempt marked succeeded, then wait for all; "
        f"median of {args.repeats}",
        file=sys.stderr,
    )
    for repeat in range(1, args.repeats + 1):
        for backend in backends:
            began = time.perf_counter()
            if backend is agl:
                assert agl_python is not None
                agl_info = _run_agl(agl_python, args.rollouts, args.spans_per_rollout)
                for name in PASSES:
                    backend.seconds[name].extend(agl_info["seconds"][name])
                    backend.cpu_seconds[name].extend(agl_info["cpu_seconds"][name])
            else:
                for name in PASSES:
                    wall, cpu = _run_fulgor_pass(
                        backend, args.rollouts, args.spans_per_rollout, name == "batched"
                    )
                    backend.seconds[name].append(wall)
                    backend.cpu_seconds[name].append(cpu)
            print(
                f"  repeat {repeat}/{args.repeats} {backend.label}: "
                + ", ".join(
                    f"{name} {backend.seconds[name][-1]:.3f}s (cpu {backend.cpu_seconds[name][-1]:.3f}s)"
                    for name in PASSES
                )
                + f" ({time.perf_counter() - began:.1f}s with setup)",
                file=sys.stderr,
            )

    print()
    print(_format_table(backends, agl, args.rollouts, args.spans_per_rollout))
    print()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        "times cover the whole pass; rollouts/s, spans/s and 'vs AGL' use median wall-clock time, "
        "'vs AGL cpu' the median CPU time of the benchmarking process (less sensitive to other load, "
        "blind to time spent waiting for fsync)"
    )
    for note in notes:
        print(note)
    if agl is not None:
        print(f"Agent Lightning {agl_info.get('agentlightning')} on python {agl_info.get('python')}:")
        for note in agl_info.get("notes", []):
            print(f"  {note}")
    print(_result_line(backends, agl, args.rollouts))


if __name__ == "__main__":
    main()
