"""A run folder for the dashboard's tests: a real SQLite store holding synthetic rollouts, prompt
template versions and a live worker, and the ``metrics.jsonl`` and ``run.json`` a Trainer writes.
``MARKUP`` is put into every untrusted field (tasks, outputs, tool results, feedback, attributes,
resources, ids where they allow it): a page that shows any of it as markup runs its script."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from fulgor.store.sqlite import SqliteStore
from fulgor.testing.rollouts import write_rollouts
from fulgor.training.run_report import write_run_info
from fulgor.types import PromptTemplate, RolloutConfig, RolloutRequest, Span

# Runs a script if it is ever parsed as markup: the tag, an event handler and a closed attribute.
MARKUP = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">"\'><b>bold</b>'


FAILED_EVERY = 9
MISSING_IDS_EVERY = 15
PER_STEP = 16


def missing_ids_in_step(step: int, rollouts: int) -> list[int]:
    """The indices of step ``step``'s succeeded rollouts whose first call has no token ids."""
    return [
        i
        for i in range((step - 1) * PER_STEP, min(step * PER_STEP, rollouts))
        if i % MISSING_IDS_EVERY == MISSING_IDS_EVERY - 1 and i % FAILED_EVERY != FAILED_EVERY - 1
    ]


def make_run(run_dir: Path, *, rollouts: int = 120) -> list[str]:
    """Fill ``run_dir`` (see the module docstring); returns the rollout ids, oldest first."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_make_run(run_dir, rollouts))


async def _make_run(run_dir: Path, rollouts: int) -> list[str]:
    store = SqliteStore(run_dir / "store.sqlite")
    try:
        first = await store.put_resources({"prompt": PromptTemplate(template=f"Add the numbers.\n{MARKUP}")})
        await store.put_resources({"prompt": PromptTemplate(template=f"Add the numbers exactly.\n{MARKUP}")})
        ids = await write_rollouts(
            store,
            rollouts,
            text=MARKUP,
            failed_every=FAILED_EVERY,
            missing_ids_every=MISSING_IDS_EVERY,
            resources_id=first.resources_id,
        )
        retried = await _retried_rollout(store)
        (live,) = await store.enqueue([RolloutRequest(input={"question": MARKUP}, metadata={"step": 99})])
        await store.claim(f"worker-{MARKUP}")
        await store.heartbeat(f"worker-{MARKUP}", stats={"note": MARKUP})
    finally:
        await store.close()
    steps = (rollouts + PER_STEP - 1) // PER_STEP
    lines = [
        {
            "step": step,
            "reward_mean": 0.1 + 0.05 * step,
            "val_accuracy": 0.2 + 0.04 * step if step % 2 == 0 else None,
            "loss": 1.0 / step,
            "kl": 0.01 * step,
            "tokens_per_second": 100.0 + step,
            "rollouts": 16,
            "drift/calls_missing_ids": len(missing_ids_in_step(step, rollouts)),
            "drift/merge_breaks": 3 if step == 3 else 0,
        }
        for step in range(1, steps + 1)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    write_run_info(run_dir, algorithm="grpo", hyperparameters={"group_size": 4, "note": MARKUP}, model=None)
    return [*ids, retried, live.rollout_id]


async def _retried_rollout(store: SqliteStore) -> str:
    """A rollout whose first attempt failed (one span, "first try") and whose second succeeded."""
    config = RolloutConfig(max_attempts=2, retry_on=("failed",))
    (rollout,) = await store.enqueue([RolloutRequest(input={"question": "retried"}, config=config)])
    for number, status in ((1, "failed"), (2, "succeeded")):
        (claimed,) = await store.claim("retry-worker")
        span = Span(
            rollout_id=rollout.rollout_id,
            attempt_id=claimed.attempt.attempt_id,
            trace_id=f"trace-{number}",
            span_id=f"span-{number}",
            name="first try" if number == 1 else "second try",
            start_time=1.0,
            end_time=2.0,
        )
        await store.add_spans([span])
        error = "the tool timed out" if status == "failed" else None
        await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status=status, error=error)
    return rollout.rollout_id


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``fulgor ARGS...`` (``dashboard`` or ``serve``) as its own process, and the URL it printed first."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fulgor.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url:
        process.wait(10)
        raise AssertionError(process.stderr.read() if process.stderr else "no URL printed")
    return process, url
