"""Prompt optimisation: fulgor's APO (beam and Pareto), optionally against Agent Lightning 0.3.0's APO.

Usage::

    .venv/bin/python benchmarks/apo.py [--vs-agentlightning] [--repeats 3] [--n-runners 2]

Question: on the rooms task, how good a prompt does each search find, with how many rollouts and
optimiser calls, and what does a round of it cost in wall-clock and CPU time?

The task is the rooms example (``examples/rooms``): 30 training and 30 validation meetings
(``make_splits(0)``), one prompt to optimise (``prompt_template``, starting from ``SEED_PROMPT``,
which states none of the booking rules), graded by exact agreement with the rules. The agent's
model and the critic and editor are the simulations of ``fulgor.testing``
(``simulated_rooms_model``: follows the rules its prompt states; ``simulated_optimizer``: the
critic names rules the prompt lacks, the editor appends them), answering in microseconds, so what
is timed is the searches' own machinery. They run on loopback in a process of their own
(``benchmarks/_fulgor_apo.py serve``), started afresh for each repetition, so that neither side's
CPU counts them; both sides of a repetition talk to the same two servers.

Sides, each run in a subprocess of its own, one after another:

* ``fulgor beam``: ``fulgor.Trainer(algorithm=APO(search="beam"), upstream=...)`` with Agent
  Lightning's defaults (beam 4, branch 4, 3 rounds, gradient batch 4, validation batch 16), run
  by ``benchmarks/_fulgor_apo.py run`` with fulgor's python (``.venv/bin/python``): its store,
  gateway and runner processes, the example's agent (``examples.rooms.agent.room_agent``).
* ``fulgor pareto``: the same with ``search="pareto"``, 4 proposals per step, gradient batch 4,
  and a rollout budget (``max_rollouts``) of half the rollouts Agent Lightning's defaults enqueue
  on this task (computed from its settings and the split sizes, :func:`agl_default_rollouts`:
  1224, so 612), with ``max_steps`` high enough (``--pareto-steps``, 50) that the budget, not the
  step count, ends it.
* ``Agent Lightning`` (``--vs-agentlightning``): ``agentlightning.algorithm.apo.APO`` with its
  defaults (3 rounds, the seed's validation first) through ``agentlightning.Trainer`` (its default
  client-server strategy), run by ``benchmarks/_agentlightning_apo.py`` with the python of
  ``.bench/agentlightning-0.3.0`` (created by ``benchmarks/store.py``'s ``ensure_agentlightning``
  when missing, with ``poml`` added for its APO). Its agent is the same conversation as the
  example's, built there from the example's fulgor-free parts; :func:`check_same_agent` checks,
  before anything runs, that both send the same first messages and run the same loop.

Both sides use ``--n-runners`` runner processes (2); each of fulgor's runs up to 8 rollouts at once
(its default ``max_concurrency``), each of Agent Lightning's one at a time. A repetition's seed
(0, 1, 2, ...) is the simulated optimiser's seed and each algorithm's (fulgor's ``APO(seed=)``,
Agent Lightning's ``random.seed``: its APO draws from the ``random`` module). The simulations are
deterministic, and so is fulgor's search for a seed (a step's answers are read in the order its
proposals were planned); Agent Lightning's is not quite: one of its critic templates shows the
rollouts' spans (ids, times), and the simulated critic's draw depends on all it is shown. So its
figures for one seed differ a little from run to run; the medians are what counts.

What is counted: rollouts as each search starts them (fulgor: its ``rollouts_total``, which
counts every rollout it runs; a candidate's reward on a validation task is measured once and
reused. Agent Lightning: the tasks of every batch ``evaluate_prompt_on_batch`` enqueues, which
scores the beam again on each round's validation batch). Optimiser calls: every critic and editor
request (fulgor: ``optimizer_calls_total``; Agent Lightning: calls of its ``AsyncOpenAI`` client's
``chat.completions.create``). "To best": what had been used when the best validation score (the
mean reward over all 30 validation tasks) was first reached, the seed's validation included.
Wall-clock and CPU time are those of the side's subprocess, start-up and shut-down included (CPU:
user + system time of it and its children, from ``getrusage(RUSAGE_CHILDREN)`` around it), divided
by its rounds (steps). Agent Lightning's APO polls the store every 2 s while a batch runs and its
runners poll for work every 5 s when idle: its real behaviour with its defaults, so its rounds
are slow.

Target (medians over ``--repeats``): Pareto reaches at least Agent Lightning's best score with at
most half Agent Lightning's rollouts to best, and fulgor's beam search spends less wall-clock and
less CPU time per round than Agent Lightning's. The last line of output is machine-readable::

    RESULT fulgor_beam_best=<x> fulgor_pareto_best=<x> agl_best=<x> ... target_met=true|false
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import _agentlightning_apo as agl_side  # noqa: E402
from _offline import go_offline  # noqa: E402
from examples.rooms import agent as rooms_agent  # noqa: E402
from examples.rooms import tools as rooms_tools  # noqa: E402
from examples.rooms.dataset import make_splits  # noqa: E402
from store import AGL_VERSION, _agl_env, ensure_agentlightning  # noqa: E402

BENCH_DIR = ROOT / ".bench" / "apo"
FULGOR_SCRIPT = Path(__file__).resolve().parent / "_fulgor_apo.py"
AGL_SCRIPT = Path(__file__).resolve().parent / "_agentlightning_apo.py"
DATASET_SEED = 0
MODEL, OPTIMIZER_MODEL = "rooms-sim", "optimizer-sim"
# Agent Lightning 0.3.0's APO defaults, which fulgor's beam side uses too.
AGL_DEFAULTS = {
    "beam_width": 4,
    "branch_factor": 4,
    "beam_rounds": 3,
    "gradient_batch_size": 4,
    "val_batch_size": 16,
}
PROPOSALS_PER_STEP = 4
SIDE_TIMEOUT_SECONDS = 3600


@dataclass
class SideRun:
    """One run of one side: what it reports, and what its subprocess took."""

    seed_score: float | None
    best_score: float
    rollouts_to_best: int
    optimizer_calls_to_best: int
    rollouts_total: int
    optimizer_calls_total: int
    rounds: int
    wall_seconds: float
    cpu_seconds: float
    best_prompt: str


@dataclass
class Side:
    label: str
    runs: list[SideRun] = field(default_factory=list)

    def median(self, name: str) -> float:
        values = [getattr(run, name) for run in self.runs]
        return float(statistics.median(values)) if values else float("nan")

    def per_round(self, name: str) -> float:
        values = [getattr(run, name) / max(run.rounds, 1) for run in self.runs]
        return float(statistics.median(values)) if values else float("nan")

    def cpu_ms_per_rollout(self) -> float:
        values = [1000 * run.cpu_seconds / max(run.rollouts_total, 1) for run in self.runs]
        return float(statistics.median(values)) if values else float("nan")


# -- checks and set-up ----------------------------------------------------------------------------


def agl_default_rollouts(train: int, val: int, settings: dict[str, int] = AGL_DEFAULTS) -> int:
    """The rollouts Agent Lightning 0.3.0's APO enqueues with ``settings``: the seed on the whole
    validation set, then each round every parent's gradient batches, the beam and its new
    candidates on a validation batch, and the beam's leader on the whole validation set."""
    width, branch = settings["beam_width"], settings["branch_factor"]
    gradient = min(settings["gradient_batch_size"], train)
    batch = min(settings["val_batch_size"], val)
    total, beam = val, 1
    for _ in range(settings["beam_rounds"]):
        children = width * branch
        total += children * gradient + (beam + children) * batch + val
        beam = min(width, beam + children)
    return total


def check_same_agent() -> None:
    """Agent Lightning's room agent sends what the example's sends: both run the example's
    ``converse``, and their first messages are the same for every task."""
    train, val = make_splits(DATASET_SEED)
    seed = rooms_agent.SEED_PROMPT
    problems = [
        f"first messages differ for {task['id']}"
        for task in [*train, *val]
        if agl_side.first_messages(task, seed.template) != rooms_agent.first_messages(task, seed)
    ]
    if agl_side.converse is not rooms_tools.converse:
        problems.append("the agents run different conversation loops")
    if problems:
        raise RuntimeError(
            f"benchmarks/_agentlightning_apo.py no longer matches examples/rooms/agent.py: {problems[:5]}"
        )


def ensure_apo_agentlightning() -> Path:
    """The python of ``.bench/agentlightning-0.3.0``, with ``poml`` (its APO's templates) installed."""
    python = ensure_agentlightning()
    env = _agl_env()
    probe = [str(python), "-c", "import poml"]
    if subprocess.run(probe, capture_output=True, env=env, check=False).returncode != 0:
        log_path = python.parent.parent.parent / f"agl-{AGL_VERSION}-apo-install.log"
        print(f"installing agentlightning[apo]=={AGL_VERSION} (log: {log_path}) ...", file=sys.stderr)
        with log_path.open("w") as log:
            command = [str(python), "-m", "pip", "install", f"agentlightning[apo]=={AGL_VERSION}"]
            subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=True)
        if subprocess.run(probe, capture_output=True, env=env, check=False).returncode != 0:
            raise RuntimeError(f"poml is not importable by {python}; see {log_path}")
    return python


@contextlib.contextmanager
def simulations(seed: int) -> Iterator[dict[str, str]]:
    """The simulated model and optimiser in a process of their own: their URLs."""
    command = [sys.executable, str(FULGOR_SCRIPT), "serve", f"--seed={seed}"]
    with (BENCH_DIR / f"simulations-seed{seed}.log").open("w") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=_fulgor_env(),
            cwd=ROOT,
            text=True,
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError("the simulations did not start")
        urls: dict[str, str] = json.loads(line)
        yield urls
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _fulgor_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_side(
    command: list[str], env: dict[str, str], log_path: Path, cwd: Path = ROOT
) -> tuple[dict[str, Any], float, float]:
    """Run a side script; its JSON line, and the wall-clock and CPU seconds it and its children took."""
    with log_path.open("w") as log:
        cpu_before, began = _children_cpu_seconds(), time.perf_counter()
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            cwd=cwd,
            text=True,
            timeout=SIDE_TIMEOUT_SECONDS,
            check=False,
        )
        wall, cpu = time.perf_counter() - began, _children_cpu_seconds() - cpu_before
    if done.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{command[1]} failed ({done.returncode}), log {log_path}:\n{tail}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{command[1]} printed no JSON; log {log_path}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result, wall, cpu


def _spec(seed: int, urls: dict[str, str], n_runners: int) -> dict[str, Any]:
    """What every side's run is told: the seeds, the two servers, the runners."""
    return {
        "seed": seed,
        "dataset_seed": DATASET_SEED,
        "model_url": urls["model"],
        "model": MODEL,
        "optimizer_url": urls["optimizer"],
        "optimizer_model": OPTIMIZER_MODEL,
        "n_runners": n_runners,
    }


def run_fulgor(
    search: str, seed: int, urls: dict[str, str], n_runners: int, settings: dict[str, Any]
) -> SideRun:
    name = f"fulgor-{search}-seed{seed}"
    spec = {"search": search, **_spec(seed, urls, n_runners), "run_dir": str(BENCH_DIR / name), **settings}
    spec_path = BENCH_DIR / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    command = [sys.executable, str(FULGOR_SCRIPT), "run", f"--spec={spec_path}"]
    result, wall, cpu = run_side(command, _fulgor_env(), BENCH_DIR / f"{name}.log")
    return SideRun(
        seed_score=result["seed_score"],
        best_score=result["best_score"],
        rollouts_to_best=result["rollouts_to_best"],
        optimizer_calls_to_best=result["optimizer_calls_to_best"],
        rollouts_total=result["rollouts_total"],
        optimizer_calls_total=result["optimizer_calls_total"],
        rounds=result["steps"],
        wall_seconds=wall,
        cpu_seconds=cpu,
        best_prompt=result["best_prompt"],
    )


def run_agl(python: Path, seed: int, urls: dict[str, str], n_runners: int) -> tuple[SideRun, dict[str, Any]]:
    name = f"agl-seed{seed}"
    spec = {"seed_prompt": rooms_agent.SEED_PROMPT.template, **_spec(seed, urls, n_runners)}
    spec_path = BENCH_DIR / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    env = _agl_env()
    env["PYTHONPATH"] = str(ROOT)
    # Run in .bench/apo/: AgentOps, its default tracer, writes agentops.log where it runs.
    command = [str(python), str(AGL_SCRIPT), f"--spec={spec_path}"]
    result, wall, cpu = run_side(command, env, BENCH_DIR / f"{name}.log", cwd=BENCH_DIR)
    if result["settings"] != AGL_DEFAULTS:
        raise RuntimeError(f"Agent Lightning ran with {result['settings']}, not its defaults {AGL_DEFAULTS}")
    best = result["improvements"][-1]
    run = SideRun(
        seed_score=result["seed_score"],
        best_score=result["best_score"],
        rollouts_to_best=best["rollouts"],
        optimizer_calls_to_best=best["optimizer_calls"],
        rollouts_total=result["rollouts_total"],
        optimizer_calls_total=result["optimizer_calls_total"],
        rounds=len(result["rounds"]),
        wall_seconds=wall,
        cpu_seconds=cpu,
        best_prompt=result["best_prompt"],
    )
    return run, result


# -- report ---------------------------------------------------------------------------------------


def _format_table(sides: list[Side]) -> str:
    header = (
        f"{'side':<26} {'seed':>5} {'best':>6} {'rollouts':>9} {'calls':>6} {'rollouts':>9} {'calls':>6} "
        f"{'rounds':>6} {'wall s':>7} {'wall s':>7} {'CPU s':>7} {'CPU ms':>7}  best per repeat"
    )
    second = (
        f"{'':<26} {'score':>5} {'score':>6} {'to best':>9} {'to best':>6} {'total':>9} {'total':>6} "
        f"{'':>6} {'total':>7} {'/round':>7} {'/round':>7} {'/rollout':>7}"
    )
    lines = [header, second, "-" * len(header)]
    for side in sides:
        if not side.runs:
            continue
        seed = side.median("seed_score") if all(r.seed_score is not None for r in side.runs) else float("nan")
        lines.append(
            f"{side.label:<26} {seed:>5.3f} {side.median('best_score'):>6.3f} "
            f"{side.median('rollouts_to_best'):>9.0f} {side.median('optimizer_calls_to_best'):>6.0f} "
            f"{side.median('rollouts_total'):>9.0f} {side.median('optimizer_calls_total'):>6.0f} "
            f"{side.median('rounds'):>6.0f} {side.median('wall_seconds'):>7.1f} "
            f"{side.per_round('wall_seconds'):>7.2f} {side.per_round('cpu_seconds'):>7.2f} "
            f"{side.cpu_ms_per_rollout():>7.1f}  "
            + " ".join(f"{r.best_score:.3f}@{r.rollouts_to_best}" for r in side.runs)
        )
    return "\n".join(lines)


def _result_line(beam: Side, pareto: Side, agl: Side | None, budget: int) -> tuple[str, list[str]]:
    fields = {
        "fulgor_beam_best": f"{beam.median('best_score'):.3f}",
        "fulgor_pareto_best": f"{pareto.median('best_score'):.3f}",
        "fulgor_beam_rollouts_to_best": f"{beam.median('rollouts_to_best'):.0f}",
        "fulgor_pareto_rollouts_to_best": f"{pareto.median('rollouts_to_best'):.0f}",
        "fulgor_pareto_budget": str(budget),
        "fulgor_beam_seconds_per_round": f"{beam.per_round('wall_seconds'):.2f}",
        "fulgor_beam_cpu_per_round": f"{beam.per_round('cpu_seconds'):.2f}",
    }
    verdict: list[str] = []
    if agl is not None:
        ratio = pareto.median("rollouts_to_best") / agl.median("rollouts_to_best")
        wall_ratio = agl.per_round("wall_seconds") / beam.per_round("wall_seconds")
        cpu_ratio = agl.per_round("cpu_seconds") / beam.per_round("cpu_seconds")
        fields.update(
            {
                "agl_best": f"{agl.median('best_score'):.3f}",
                "agl_rollouts_to_best": f"{agl.median('rollouts_to_best'):.0f}",
                "rollouts_ratio": f"{ratio:.3f}",
                "agl_seconds_per_round": f"{agl.per_round('wall_seconds'):.2f}",
                "agl_cpu_per_round": f"{agl.per_round('cpu_seconds'):.2f}",
                "wall_per_round_vs_agl": f"{wall_ratio:.2f}",
                "cpu_per_round_vs_agl": f"{cpu_ratio:.2f}",
            }
        )
        checks = {
            "Pareto's best >= Agent Lightning's": pareto.median("best_score") >= agl.median("best_score"),
            "Pareto's rollouts to best <= half Agent Lightning's": ratio <= 0.5,
            "fulgor beam wall s/round < Agent Lightning's": beam.per_round("wall_seconds")
            < agl.per_round("wall_seconds"),
            "fulgor beam CPU s/round < Agent Lightning's": beam.per_round("cpu_seconds")
            < agl.per_round("cpu_seconds"),
        }
        verdict = [f"{'met' if ok else 'MISSED'}: {name}" for name, ok in checks.items()]
        fields["target_met"] = "true" if all(checks.values()) else "false"
    return "RESULT " + " ".join(f"{key}={value}" for key, value in fields.items()), verdict


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vs-agentlightning",
        action="store_true",
        help=f"also run Agent Lightning {AGL_VERSION}'s APO (installed into .bench/)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per side (seeds 0..N-1); medians count")
    parser.add_argument("--n-runners", type=int, default=2, help="runner processes on each side")
    parser.add_argument(
        "--pareto-steps", type=int, default=50, help="Pareto's max_steps (its rollout budget ends it first)"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.n_runners < 1 or args.pareto_steps < 1:
        parser.error("--repeats, --n-runners and --pareto-steps must be at least 1")

    started = time.perf_counter()
    check_same_agent()
    agl_python = ensure_apo_agentlightning() if args.vs_agentlightning else None
    shutil.rmtree(BENCH_DIR, ignore_errors=True)
    BENCH_DIR.mkdir(parents=True)

    train, val = make_splits(DATASET_SEED)
    agl_rollouts = agl_default_rollouts(len(train), len(val))
    budget = agl_rollouts // 2
    beam_settings = {
        "search": "beam",
        "beam_width": AGL_DEFAULTS["beam_width"],
        "branch_factor": AGL_DEFAULTS["branch_factor"],
        "max_steps": AGL_DEFAULTS["beam_rounds"],
        "gradient_batch_size": AGL_DEFAULTS["gradient_batch_size"],
        "val_batch_size": AGL_DEFAULTS["val_batch_size"],
    }
    pareto_settings = {
        "search": "pareto",
        "proposals_per_step": PROPOSALS_PER_STEP,
        "gradient_batch_size": AGL_DEFAULTS["gradient_batch_size"],
        "max_steps": args.pareto_steps,
        "max_rollouts": budget,
    }
    beam = Side("fulgor beam")
    pareto = Side(f"fulgor pareto (<= {budget})")
    agl = Side(f"Agent Lightning {AGL_VERSION}") if args.vs_agentlightning else None
    notes: list[str] = []
    print(
        f"rooms task: {len(train)} train / {len(val)} val tasks, simulated model and optimiser; "
        f"{args.repeats} repeats, {args.n_runners} runners per side; Pareto budget {budget} rollouts "
        f"(half of Agent Lightning's {agl_rollouts}); files in {BENCH_DIR}",
        file=sys.stderr,
    )
    for seed in range(args.repeats):
        with simulations(seed) as urls:
            for side, settings in ((beam, beam_settings), (pareto, pareto_settings)):
                run = run_fulgor(str(settings["search"]), seed, urls, args.n_runners, settings)
                side.runs.append(run)
                _progress(seed, side, run)
            if agl is not None:
                assert agl_python is not None
                run, detail = run_agl(agl_python, seed, urls, args.n_runners)
                agl.runs.append(run)
                _progress(seed, agl, run)
                if run.rollouts_total != agl_rollouts:
                    notes.append(
                        f"seed {seed}: Agent Lightning enqueued {run.rollouts_total} rollouts, "
                        f"not the {agl_rollouts} its settings give (a failed edit is skipped)"
                    )
                rounds = ", ".join(f"{r['round_seconds']:.1f}" for r in detail["rounds"])
                print(f"    Agent Lightning round seconds (in its loop): {rounds}", file=sys.stderr)

    sides = [beam, pareto] + ([agl] if agl is not None else [])
    print()
    print(_format_table(sides))
    print()
    seeds = {round(run.seed_score, 6) for side in sides for run in side.runs if run.seed_score is not None}
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"medians of {args.repeats}; seed prompt's validation score on every side and seed: "
        f"{', '.join(f'{s:.3f}' for s in sorted(seeds))}; 'best per repeat' is score@rollouts to best"
    )
    print(
        "wall and CPU: the side's whole subprocess (start-up included; CPU of it and its children), "
        "over its rounds; rollouts: fulgor's rollouts_total / Agent Lightning's enqueued tasks"
    )
    print(f"took {time.perf_counter() - started:.0f} s")
    for note in notes:
        print(note)
    line, verdict = _result_line(beam, pareto, agl, budget)
    for item in verdict:
        print(item)
    print(line)


def _progress(seed: int, side: Side, run: SideRun) -> None:
    print(
        f"  seed {seed} {side.label}: best {run.best_score:.3f} (seed {run.seed_score or 0:.3f}) at "
        f"{run.rollouts_to_best} rollouts / {run.optimizer_calls_to_best} calls; {run.rollouts_total} "
        f"rollouts in {run.rounds} rounds, {run.wall_seconds:.1f} s wall, {run.cpu_seconds:.1f} s CPU",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
