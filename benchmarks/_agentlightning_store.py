"""The Agent Lightning side of ``benchmarks/store.py``, and the workload both sides share.

This file is two things:

* The workload definition (task inputs, span names and attributes) as plain stdlib functions, which
  ``benchmarks/store.py`` imports so that fulgor and Agent Lightning store identical content.
* A script, run with the python of the ``.bench/agentlightning-0.3.0`` virtual environment (never
  fulgor's), that runs the workload against Agent Lightning 0.3.0's ``InMemoryLightningStore`` and
  prints one JSON object on stdout::

      {"agentlightning": "0.3.0", "rollouts": 2000, "spans_per_rollout": 10,
       "seconds": {"per_span": [..], "batched": [..]}, "cpu_seconds": {..}, "notes": [..]}

Agent Lightning is imported only inside :func:`main`, so importing this module costs nothing.

How each workload operation maps onto Agent Lightning's store API (the fastest honest equivalent):

=====================================  ==========================================================
workload                               ``InMemoryLightningStore``
=====================================  ==========================================================
enqueue N rollouts in one call         ``enqueue_many_rollouts([EnqueueRolloutRequest, ...])``
claim one rollout                      ``dequeue_rollout(worker_id=...)``
add one span (pass ``per_span``)       ``add_span(span)``
add 10 spans (pass ``batched``)        ``add_many_spans(spans)``
mark the attempt succeeded             ``update_attempt(rollout_id, attempt_id, status="succeeded")``
wait for all rollouts                  ``wait_for_rollouts(rollout_ids=..., timeout=...)``
=====================================  ==========================================================

Agent Lightning's ``add_span`` takes a span whose ``sequence_id`` the caller already set, while
fulgor's ``add_spans`` allocates sequence ids in the store. Its own tracers get ids from the store
(``add_otel_span`` converts an OpenTelemetry span and allocates one; the weave tracer calls
``get_next_span_sequence_id`` and then ``add_span``). Here the single worker numbers its spans
1..10 itself and skips that extra work, which favours Agent Lightning; ``--store-sequence-ids``
measures the tracer-like variant instead (``get_next_span_sequence_id`` before each ``add_span``,
``get_many_span_sequence_ids`` before ``add_many_spans``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from collections.abc import Callable
from typing import Any

WORKER_ID = "bench-worker-0"
SPAN_NAMES = (
    "agent.turn",
    "llm.chat",
    "tool.search",
    "llm.chat",
    "tool.python",
    "llm.chat",
    "tool.search",
    "llm.chat",
    "agent.message",
    "agent.reward",
)
WAIT_TIMEOUT_SECONDS = 120.0
PASSES = ("per_span", "batched")


def task_input(index: int) -> dict[str, Any]:
    """The input of the ``index``-th rollout."""
    return {"question": f"What is {index} + 2?", "answer": str(index + 2), "index": index}


def trace_id(rollout_index: int) -> str:
    """32 hex digits, one trace per rollout."""
    return f"{rollout_index + 1:032x}"


def span_id(rollout_index: int, span_index: int) -> str:
    """16 hex digits, unique across the whole run."""
    return f"{rollout_index * 1000 + span_index + 1:016x}"


def parent_id(rollout_index: int, span_index: int) -> str | None:
    """The first span of a rollout is the root; the others are its children."""
    return None if span_index == 0 else span_id(rollout_index, 0)


def span_attributes(rollout_index: int, span_index: int) -> dict[str, str]:
    """Five string attributes, the same on both sides."""
    return {
        "gen_ai.system": "openai",
        "gen_ai.request.model": "bench-tiny",
        "gen_ai.prompt": f"rollout {rollout_index} step {span_index}: What is {rollout_index} + 2?",
        "gen_ai.completion": f"The answer is {rollout_index + 2}.",
        "agent.name": "bench-agent",
    }


def span_times(span_index: int, now: float) -> tuple[float, float]:
    """Start and end time of a span: each span lasts a millisecond."""
    start = now + span_index * 0.001
    return start, start + 0.001


# -- Agent Lightning ------------------------------------------------------------------------------


def agl_span_factory() -> Callable[[str, str, int, int, float, int], Any]:
    """``make_span(rollout_id, attempt_id, i, j, now, sequence_id)``, building the workload's spans.

    They are Agent Lightning ``Span`` objects, so this needs its environment (imported when called).
    """
    from agentlightning.types import OtelResource, Span, TraceStatus

    def make_span(rollout_id: str, attempt_id: str, i: int, j: int, now: float, sequence_id: int) -> Span:
        start, end = span_times(j, now)
        return Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=sequence_id,
            trace_id=trace_id(i),
            span_id=span_id(i, j),
            parent_id=parent_id(i, j),
            name=SPAN_NAMES[j % len(SPAN_NAMES)],
            status=TraceStatus(status_code="OK"),
            attributes=span_attributes(i, j),
            events=[],
            links=[],
            start_time=start,
            end_time=end,
            context=None,
            parent=None,
            resource=OtelResource(attributes={}, schema_url=""),
        )

    return make_span


async def _run_pass(
    rollouts: int, spans_per_rollout: int, batched: bool, store_ids: bool = False
) -> tuple[float, float]:
    from agentlightning.store import InMemoryLightningStore

    return await run_agl_workload(InMemoryLightningStore(), rollouts, spans_per_rollout, batched, store_ids)


async def run_agl_workload(
    store: Any, rollouts: int, spans_per_rollout: int, batched: bool, store_ids: bool = False
) -> tuple[float, float]:
    """The workload on an Agent Lightning store (in memory, or its HTTP client): (seconds, CPU seconds)."""
    from agentlightning.types import EnqueueRolloutRequest

    requests = [EnqueueRolloutRequest(input=task_input(i), mode="train") for i in range(rollouts)]
    make_span = agl_span_factory()
    gc.collect()

    began, began_cpu = time.perf_counter(), time.process_time()
    enqueued = await store.enqueue_many_rollouts(requests)
    for i in range(rollouts):
        claimed = await store.dequeue_rollout(worker_id=WORKER_ID)
        if claimed is None:
            raise RuntimeError(f"queue empty after {i} of {rollouts} claims")
        rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
        now = time.time()
        if batched:
            if store_ids:
                ids = await store.get_many_span_sequence_ids([(rollout_id, attempt_id)] * spans_per_rollout)
            else:
                ids = range(1, spans_per_rollout + 1)
            await store.add_many_spans(
                [make_span(rollout_id, attempt_id, i, j, now, ids[j]) for j in range(spans_per_rollout)]
            )
        else:
            for j in range(spans_per_rollout):
                if store_ids:
                    sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
                else:
                    sequence_id = j + 1
                await store.add_span(make_span(rollout_id, attempt_id, i, j, now, sequence_id))
        await store.update_attempt(rollout_id, attempt_id, status="succeeded")
    rollout_ids = [rollout.rollout_id for rollout in enqueued]
    # Its HTTP client refuses waits above 0.1 s, so waiting is a loop of short waits.
    deadline = time.monotonic() + WAIT_TIMEOUT_SECONDS
    done = await store.wait_for_rollouts(rollout_ids=rollout_ids, timeout=0.1)
    while len(done) < rollouts and time.monotonic() < deadline:
        done = await store.wait_for_rollouts(rollout_ids=rollout_ids, timeout=0.1)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - began_cpu

    # Check, outside the timed part, that the workload really happened.
    if len(done) != rollouts or any(rollout.status != "succeeded" for rollout in done):
        raise RuntimeError(f"only {len(done)} of {rollouts} rollouts finished")
    stats = await store.statistics()
    if stats.get("total_spans") != rollouts * spans_per_rollout:
        raise RuntimeError(
            f"expected {rollouts * spans_per_rollout} spans, store has {stats.get('total_spans')}"
        )
    return elapsed, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--spans-per-rollout", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--store-sequence-ids",
        action="store_true",
        help="ask the store for span sequence ids first, as Agent Lightning's tracers do (not the default)",
    )
    parser.add_argument(
        "--passes", default=",".join(PASSES), help="comma-separated subset of per_span,batched"
    )
    args = parser.parse_args(argv)
    passes = [name for name in args.passes.split(",") if name]
    unknown = set(passes) - set(PASSES)
    if unknown:
        parser.error(f"unknown passes: {sorted(unknown)}")

    from importlib.metadata import version

    seconds: dict[str, list[float]] = {name: [] for name in passes}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(args.repeats):
        for name in passes:
            batched = name == "batched"
            wall, cpu = asyncio.run(
                _run_pass(args.rollouts, args.spans_per_rollout, batched, args.store_sequence_ids)
            )
            seconds[name].append(wall)
            cpu_seconds[name].append(cpu)
    result = {
        "agentlightning": version("agentlightning"),
        "python": sys.version.split()[0],
        "rollouts": args.rollouts,
        "spans_per_rollout": args.spans_per_rollout,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "notes": [
            "enqueue_many_rollouts / dequeue_rollout / add_span / add_many_spans / update_attempt / "
            "wait_for_rollouts on InMemoryLightningStore()",
            "span sequence ids from get_next_span_sequence_id / get_many_span_sequence_ids (one more call)"
            if args.store_sequence_ids
            else "span sequence ids assigned by the worker (1..N), not allocated by the store",
        ],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
