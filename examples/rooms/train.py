"""The rooms example: APO improves the room-booking agent's prompts, on any OpenAI-compatible model.

The agent (:mod:`examples.rooms.agent`, the plain ``openai`` SDK) books rooms for 30 training and
30 validation meetings; its seed prompts state none of the booking rules, and the grade
(:mod:`examples.rooms.rules`) rewards exact agreement with them and says in words what was wrong.
:class:`fulgor.APO` searches for better prompts (both the system prompt and the request template,
or only the request template with ``--prompts request``) with a critic and an editor model, and
prints the best prompts, their validation score and where they are written.

    python -m examples.rooms.train --simulate                 # simulations on loopback, no key
    python -m examples.rooms.train --model-url https://api.openai.com/v1 --model gpt-4.1-mini \\
        --key-env OPENAI_API_KEY --optimizer-model gpt-4.1 [--search pareto]

``--simulate`` runs the agent's model and the optimiser as the simulations ``fulgor.testing``
ships (a model that follows the rules its prompt states; a critic that names rules the prompt
lacks; an editor that adds them), speaking the OpenAI protocol over HTTP on loopback. The search
and everything around it (store, gateway, runners, resources, recording) are fulgor's own either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from examples.rooms.agent import SEED_PROMPT, SEED_SYSTEM_PROMPT, room_agent
from examples.rooms.dataset import make_splits

__all__ = ["main", "optimise"]

logger = logging.getLogger("examples.rooms")


def optimise(args: argparse.Namespace, model_url: str, optimizer_url: str) -> dict[str, Any]:
    """Run the search against the model at ``model_url``; what it found and what it used."""
    from fulgor import APO, LLM, Trainer
    from fulgor.gateway import Upstream

    key = os.environ[args.key_env] if args.key_env else None
    optimizer_key = os.environ[args.optimizer_key_env] if args.optimizer_key_env else key
    prompts = {"prompt_template": SEED_PROMPT}
    if args.prompts == "both":
        prompts["system_prompt"] = SEED_SYSTEM_PROMPT
    algorithm = APO(
        prompts=prompts,
        optimizer=LLM(endpoint=optimizer_url, model=args.optimizer_model, api_key=optimizer_key),
        search=args.search,
        max_steps=args.steps,
        max_rollouts=args.max_rollouts,
        seed=args.seed,
    )
    train, val = make_splits(args.seed)
    trainer = Trainer(
        algorithm=algorithm,
        upstream=Upstream(model_url, api_key=key, request_token_ids=args.token_ids),
        model=args.model,
        run_dir=args.run_dir,
        n_runners=1,
        max_concurrency=16,
        progress=sys.stderr.isatty(),
    )
    history = trainer.fit(room_agent, train, val)
    summary = json.loads((args.run_dir / "apo" / "best.json").read_text())
    candidates = json.loads((args.run_dir / "apo" / "candidates.json").read_text())
    seed = next(c for c in candidates if c["id"] == "seed")
    last = history[-1] if history else {}
    return {
        "seed_score": seed["val_score"],
        "best_score": summary["score"],
        "best": summary["id"],
        "steps": len(history),
        "rollouts": last.get("rollouts_total"),
        "optimizer_calls": last.get("optimizer_calls_total"),
        "prompts": {name: p["template"] for name, p in summary["prompts"].items()},
    }


@contextlib.contextmanager
def _simulations(seed: int) -> Iterator[tuple[str, str]]:
    from fulgor.testing import simulated_optimizer, simulated_rooms_model

    with simulated_rooms_model() as model, simulated_optimizer(seed) as optimizer:
        yield model.url, optimizer.url


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.simulate and (args.model_url is None or args.model is None or args.optimizer_model is None):
        print("error: pass --simulate, or --model-url, --model and --optimizer-model", file=sys.stderr)
        return 2
    for name in ("uvicorn", "uvicorn.error", "httpx", "fulgor.gateway", "fulgor.store", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    args.run_dir = args.run_dir or Path("runs") / time.strftime("rooms-%Y%m%d-%H%M%S")
    started = time.monotonic()
    try:
        if args.simulate:
            args.model, args.optimizer_model, args.token_ids = "rooms-sim", "optimizer-sim", True
            with _simulations(args.seed) as (model_url, optimizer_url):
                result = optimise(args, model_url, optimizer_url)
        else:
            result = optimise(args, args.model_url, args.optimizer_url or args.model_url)
    except KeyboardInterrupt:
        print(f"\ninterrupted: continue with --run-dir {args.run_dir}", file=sys.stderr)
        return 130
    print(f"\nvalidation score: {result['seed_score']:.3f} (seed prompts) -> {result['best_score']:.3f}")
    print(f"used: {result['rollouts']} rollouts, {result['optimizer_calls']} optimiser calls, "
          f"{time.monotonic() - started:.0f}s")  # fmt: skip
    for name, text in result["prompts"].items():
        print(f"\n--- {name} ({args.run_dir / 'apo' / 'best' / f'{name}.txt'}):\n{text}")
    print(f"\nhistory: {args.run_dir / 'apo' / 'candidates.json'}; continue with --run-dir {args.run_dir}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.rooms.train", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--simulate", action="store_true", help="the simulated model and optimiser")
    parser.add_argument("--model-url", help="the agent's model: an OpenAI base URL (ending in /v1)")
    parser.add_argument("--model", help="the agent's model name")
    parser.add_argument("--key-env", help="the environment variable holding the model's API key")
    parser.add_argument("--token-ids", action="store_true", help="ask the server for token ids (vLLM)")
    parser.add_argument("--optimizer-url", help="the critic's and editor's base URL (default --model-url)")
    parser.add_argument("--optimizer-model", help="the critic's and editor's model name")
    parser.add_argument("--optimizer-key-env", help="its API key's variable (default --key-env)")
    parser.add_argument("--search", choices=("beam", "pareto"), default="beam")
    parser.add_argument("--prompts", choices=("both", "request"), default="both", help="what to optimise")
    parser.add_argument("--steps", type=int, default=3, help="search steps (default 3)")
    parser.add_argument("--max-rollouts", type=int, help="stop once this many rollouts are used")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, help="default: a new runs/rooms-<date>-<time>")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
