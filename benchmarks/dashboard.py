"""Does the dashboard answer within 200 ms on a store of 100,000 rollouts and 1,000,000 spans?

Builds (once, then reuses) a SQLite store under ``.bench/dashboard/`` through the real store: 100,000
ended rollouts of 10 spans each (a root span, six model calls with token ids and logprobs, a tool
span, a reward span with feedback, one more), in steps of 16 rollouts, two agents. Then serves it
with ``fulgor dashboard`` (the real command, its own process) and times, over HTTP from this
process, each page a user opens: the rollouts page (newest first, and with each filter and sort),
a page deep in the list, the rollouts behind one step's drift count (which reads each of the step's
rollouts whole), and one rollout's page (its spans, model calls and token view). Each URL
is asked ``--repeat`` times; the table gives the median and the slowest, and the target is met when
every median is under 200 ms.

    .venv/bin/python benchmarks/dashboard.py                 # 100k rollouts, 1M spans
    .venv/bin/python benchmarks/dashboard.py --rollouts 2000 # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from _offline import go_offline
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.rollouts import write_rollouts

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 200.0


async def build(path: Path, rollouts: int) -> None:
    store = SqliteStore(path)
    try:
        done = sum((await store.stats()).rollouts.values())
        started = time.perf_counter()
        while done < rollouts:
            count = min(5000, rollouts - done)
            await write_rollouts(
                store,
                count,
                calls=6,
                seed=done,
                first_index=done,
                batch=1000,
                failed_every=13,
                missing_ids_every=50,
            )
            done += count
            rate = done / (time.perf_counter() - started)
            print(f"  {done} rollouts written ({rate:.0f}/s)", file=sys.stderr, flush=True)
    finally:
        await store.close()


async def _span_count(path: Path) -> int:
    from fulgor.dashboard import SqliteReader

    reader = SqliteReader(path)
    try:
        return (await reader.stats()).spans
    finally:
        await reader.close()


def serve(path: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "fulgor.cli.main", "dashboard", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http"):
        process.kill()
        raise SystemExit(f"fulgor dashboard did not start: {url!r}")
    return process, url


def response_rollouts(page: str) -> int:
    return page.count('class="rollout-link"')


def main() -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    folder = ROOT / ".bench" / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"store-{args.rollouts}.sqlite"
    print(f"store {path} ({args.rollouts} rollouts)", file=sys.stderr)
    asyncio.run(build(path, args.rollouts))
    process, url = serve(path)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            first = client.get("/rollouts?per_page=1").text
            marker = 'class="rollout-link" href="/rollouts/'
            rollout_id = first.split(marker, 1)[1].split('"', 1)[0]
            last_page = args.rollouts // 50
            # A step in the middle with a call that has no token ids (the first call of every 50th
            # rollout) in a rollout that succeeded (every 13th fails).
            missing = next(
                i for i in range(args.rollouts // 2, args.rollouts) if i % 50 == 49 and i % 13 != 12
            )
            drift_step = missing // 16 + 1
            pages = {
                "rollouts, newest first": "/rollouts",
                "rollouts, page 1000": f"/rollouts?page={min(1000, last_page)}",
                "rollouts, status=failed": "/rollouts?status=failed",
                "rollouts, mode=val": "/rollouts?mode=val",
                "rollouts, agent=checker": "/rollouts?agent=checker",
                "rollouts, reward 0.9-1.0": "/rollouts?reward_min=0.9&reward_max=1",
                "rollouts, sort by reward": "/rollouts?sort=reward_desc",
                "rollouts, one step": f"/rollouts?step={drift_step}",
                "rollouts, one group": "/rollouts?group=step-2-group-5",
                "rollouts, step drift": f"/rollouts?step={drift_step}&problem=calls_missing_ids",
                "one rollout (10 spans, 6 calls)": f"/rollouts/{rollout_id}",
                "runs": "/",
            }
            rows = []
            for name, page in pages.items():
                response = client.get(page)
                response.raise_for_status()
                times = []
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    client.get(page).raise_for_status()
                    times.append((time.perf_counter() - started) * 1000)
                rows.append((name, statistics.median(times), max(times), len(response.content)))
            drift_rows = response_rollouts(client.get(pages["rollouts, step drift"]).text)
            if drift_rows != 1:
                raise SystemExit(
                    f"the step drift page lists {drift_rows} rollouts, not the 1 with missing ids"
                )
    finally:
        process.terminate()
        process.wait(timeout=30)
    spans = asyncio.run(_span_count(path))
    size = path.stat().st_size / 2**20
    print(
        f"\nfulgor dashboard over {args.rollouts:,} rollouts and {spans:,} spans ({size:,.0f} MiB), "
        f"{args.repeat} requests each"
    )
    print(f"{'page':<34} {'median ms':>10} {'max ms':>8} {'KiB':>7}")
    for name, median, slowest, size_bytes in rows:
        print(f"{name:<34} {median:>10.1f} {slowest:>8.1f} {size_bytes / 1024:>7.1f}")
    worst = max(median for _, median, _, _ in rows)
    rollouts_ms = rows[0][1]
    rollout_ms = next(median for name, median, _, _ in rows if name.startswith("one rollout"))
    met = all(median < TARGET_MS for _, median, _, _ in rows)
    print(
        f"RESULT rollouts={args.rollouts} spans={spans} rollouts_page_ms={rollouts_ms:.1f} "
        f"rollout_page_ms={rollout_ms:.1f} slowest_median_ms={worst:.1f} cores={os.cpu_count()} "
        f"target_met={str(met).lower()}"
    )


if __name__ == "__main__":
    main()
