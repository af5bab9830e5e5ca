"""The fulgor side of ``benchmarks/apo.py``, and the simulations both sides talk to.

Two commands, each run with fulgor's python (``.venv/bin/python``) and the repository root on
``PYTHONPATH``:

* ``serve --seed N``: the simulated agent model (``fulgor.testing.simulated_rooms_model``) and the
  simulated critic and editor (``simulated_optimizer(seed=N)``) on loopback, in a process of their
  own so that neither side's CPU counts them. It prints ``{"model": URL, "optimizer": URL}`` and
  serves until its stdin is closed.
* ``run --spec FILE``: ``fulgor.Trainer(algorithm=APO(...), upstream=URL, ...).fit(room_agent,
  train, val)`` on the rooms example (``examples/rooms``: its agent, its seed prompt, its splits),
  with the settings the spec gives, and prints one JSON object on stdout: the metrics of every
  step, the seed's and the best validation score, and the rollouts and optimiser calls used to
  reach the best (``best_rollouts`` and ``best_optimizer_calls`` of the last step: what the
  search had used when its best was first reached, the seed's validation included).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

# The settings of APO a spec may give (the others keep fulgor's defaults).
SETTINGS = (
    "search",
    "beam_width",
    "branch_factor",
    "proposals_per_step",
    "max_steps",
    "gradient_batch_size",
    "val_batch_size",
    "max_rollouts",
)


def serve(seed: int) -> None:
    from fulgor.testing import simulated_optimizer, simulated_rooms_model

    with simulated_rooms_model() as model, simulated_optimizer(seed) as optimizer:
        print(json.dumps({"model": model.url, "optimizer": optimizer.url}), flush=True)
        sys.stdin.read()  # until the benchmark closes it


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from examples.rooms.agent import SEED_PROMPT, room_agent
    from examples.rooms.dataset import make_splits
    from fulgor import APO, LLM, Trainer
    from fulgor.training.reports import QUIET_LOGGERS

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    train, val = make_splits(spec["dataset_seed"])
    run_dir = Path(spec["run_dir"])
    algorithm = APO(
        prompts={"prompt_template": SEED_PROMPT},
        optimizer=LLM(endpoint=spec["optimizer_url"], model=spec["optimizer_model"]),
        seed=spec["seed"],
        **{key: spec[key] for key in SETTINGS if key in spec},
    )
    trainer = Trainer(
        algorithm=algorithm,
        upstream=spec["model_url"],
        model=spec["model"],
        run_dir=run_dir,
        n_runners=spec["n_runners"],
        progress=False,
    )
    started = time.perf_counter()
    history = trainer.fit(room_agent, train, val)
    elapsed = time.perf_counter() - started

    candidates = json.loads((run_dir / "apo" / "candidates.json").read_text())
    seed = next(c for c in candidates if c["id"] == "seed")
    best = json.loads((run_dir / "apo" / "best.json").read_text())
    last = history[-1] if history else {}
    return {
        "settings": algorithm.hyperparameters(),
        "n_runners": spec["n_runners"],
        "seed_score": seed["val_score"],
        "best_score": best["score"],
        "best_prompt": best["prompts"]["prompt_template"]["template"],
        "rollouts_to_best": last.get("best_rollouts", len(val)),
        "optimizer_calls_to_best": last.get("best_optimizer_calls", 0),
        "rollouts_total": last.get("rollouts_total", len(val)),
        "optimizer_calls_total": last.get("optimizer_calls_total", 0),
        "steps": len(history),
        "history": history,
        "elapsed_seconds": elapsed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve", help="serve the simulated model and optimiser")
    serving.add_argument("--seed", type=int, default=0, help="the simulated optimiser's seed")
    running = commands.add_parser("run", help="run fulgor's APO; print one JSON object")
    running.add_argument("--spec", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.seed)
    else:
        print(json.dumps(run(json.loads(args.spec.read_text()))))


if __name__ == "__main__":
    main()
