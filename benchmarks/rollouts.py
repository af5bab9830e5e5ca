"""End-to-end rollouts/s: store server + gateway + runner pool + an agent making six model calls.

Usage::

    .venv/bin/python benchmarks/rollouts.py [--rollouts 600] [--repeats 3] [--n-runners 2]
        [--max-concurrency 8]

Everything runs as the real processes a user starts, on loopback:

* an instant OpenAI-compatible upstream (``python -m fulgor.testing.openai_server``) that returns
  token ids, standing in for the engine so that the model's speed is not what is measured;
* ``fulgor serve --upstream URL``: the SQLite store and the gateway in one process;
* ``fulgor runner --n-runners N --store http://... --gateway-url http://...``: the runner pool,
  running ``benchmarks/_rollouts_agent.py:six_calls`` (the ``openai`` SDK, six chat calls, a reward).

Each repetition enqueues the rollouts in one call, starts the clock, and waits until all have
succeeded; it checks that every rollout recorded its six model calls with token ids and its reward.
It reports rollouts/s (median of the repetitions) and the CPU seconds per rollout of each process
group (read from /proc: the least noisy figure on a shared machine). The model answers at once, so
what is measured is fulgor's own machinery; the target is at least 30 rollouts/s on 2 cores. The
last line is ``RESULT ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _offline import go_offline
from fulgor import LLM, RolloutRequest, semconv
from fulgor.store.client import StoreClient

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def start(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A process that prints its URL as its first line of output."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise SystemExit(f"{command[:4]} printed nothing; run it by hand to see why")
    return process, line


def tree(pid: int) -> list[int]:
    """``pid`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [pid], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / CLOCK_TICKS


async def one_repetition(url: str, n: int, groups: dict[str, list[int]]) -> tuple[float, dict[str, float]]:
    store = StoreClient(url)
    requests = [RolloutRequest(input={"n": i}) for i in range(n)]
    before = {name: cpu_seconds(pids) for name, pids in groups.items()}
    started = time.perf_counter()
    created = await store.enqueue(requests)
    ids = [r.rollout_id for r in created]
    done = await store.wait(ids, timeout_seconds=600)
    elapsed = time.perf_counter() - started
    after = {name: cpu_seconds(pids) for name, pids in groups.items()}
    if len(done) != n or any(r.status != "succeeded" for r in done):
        raise SystemExit(f"only {sum(r.status == 'succeeded' for r in done)} of {n} rollouts succeeded")
    for rollout_id in ids[:: max(1, n // 20)]:  # a sample: every call recorded with ids, the reward too
        calls = await store.query_spans(rollout_id, name=semconv.SPAN_MODEL_CALL)
        rewards = await store.query_spans(rollout_id, name=semconv.SPAN_REWARD)
        model_calls = [s.attributes[semconv.ATTR_MODEL_CALL] for s in calls]
        assert len(model_calls) == 6, rollout_id
        assert all(c["response_token_ids"] for c in model_calls), rollout_id
        assert len(rewards) == 1, rollout_id
    await store.close()
    return elapsed, {name: (after[name] - before[name]) / n for name in groups}


def main() -> int:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rollouts", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-runners", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=8)
    args = parser.parse_args()

    fulgor = [PYTHON, "-m", "fulgor.cli.main"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT}"}
    processes: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory() as directory:
        try:
            upstream, upstream_url = start([PYTHON, "-m", "fulgor.testing.openai_server", "--port", "0"])
            processes.append(upstream)
            store_url = f"sqlite:///{directory}/store.sqlite"
            server, url = start(
                [*fulgor, "serve", "--port", "0", "--store", store_url, "--upstream", upstream_url]
            )
            processes.append(server)
            asyncio.run(_put_llm(url))
            runner_command = [*fulgor, "runner", "--agent", "_rollouts_agent:six_calls", "--store", url]
            runner_command += ["--gateway-url", url, "--n-runners", str(args.n_runners)]
            runner_command += ["--max-concurrency", str(args.max_concurrency), "--heartbeat-seconds", "2"]
            runners, _ = start(runner_command, env=env)
            processes.append(runners)
            time.sleep(3)  # let the runner processes import and start claiming
            groups = {
                "server+gateway": tree(server.pid),
                "runners": tree(runners.pid),
                "upstream": tree(upstream.pid),
            }
            asyncio.run(one_repetition(url, 50, groups))  # warm-up: imports, connections
            results = [asyncio.run(one_repetition(url, args.rollouts, groups)) for _ in range(args.repeats)]
        finally:
            for process in reversed(processes):  # runners first, while the server still answers them
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
    report(args, results)
    return 0


async def _put_llm(url: str) -> None:
    store = StoreClient(url)
    await store.put_resources({"llm": LLM(endpoint="http://unused/v1", model="scripted-model")})
    await store.close()


def report(args: argparse.Namespace, results: list[tuple[float, dict[str, float]]]) -> None:
    rates = [args.rollouts / elapsed for elapsed, _ in results]
    cpu = {name: statistics.median(r[1][name] for r in results) for name in results[0][1]}
    total_cpu = sum(cpu.values())
    rate = statistics.median(rates)
    print(
        f"{args.rollouts} rollouts x 6 model calls, n_runners={args.n_runners}, "
        f"max_concurrency={args.max_concurrency}, {os.cpu_count()} CPUs, median of {args.repeats}"
    )
    print(f"{'measure':<34}{'value':>12}")
    print("-" * 46)
    print(f"{'rollouts/s':<34}{rate:>12.1f}")
    print(f"{'model calls/s':<34}{rate * 6:>12.1f}")
    for name, seconds in cpu.items():
        print(f"{'CPU ms per rollout, ' + name:<34}{seconds * 1000:>12.1f}")
    print(f"{'CPU ms per rollout, all':<34}{total_cpu * 1000:>12.1f}")
    print(f"runs (rollouts/s): {' '.join(f'{r:.1f}' for r in rates)}")
    print(
        f"RESULT rollouts_per_s={rate:.1f} model_calls_per_s={rate * 6:.1f} "
        f"cpu_ms_per_rollout={total_cpu * 1000:.1f} cpu_ms_server={cpu['server+gateway'] * 1000:.1f} "
        f"cpu_ms_runners={cpu['runners'] * 1000:.1f} target_met={'true' if rate >= 30 else 'false'}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
