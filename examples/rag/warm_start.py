"""The RAG warm start: a short SFT on synthetic searches, so the model knows the tool and the format.

A freshly built model writes noise; GRPO needs it to succeed sometimes before it can learn from its
own rollouts. The warm start shows it worked solutions of training questions in the RAG agent's
exact conversation (its instructions, the search tool as the gateway renders it, the passages the
index really returns), of two kinds: one that searches hop after hop until the answer, and one that
stops early and answers with the name the last search gave (the bridge entity, not the answer).

It runs in two phases. For the first ``full_steps`` steps every solution searches to the end: the
model learns to copy a name and a word of the question into a query, and the name a passage gives
into the next query or the answer. For the rest, a solution searches to the end with probability
``full_fraction`` only: the model ends up knowing how, but mostly stopping one search short. GRPO
then finds out from the rewards that the last search pays.

    python -m examples.rag.warm_start --model runs/rag/base --out runs/rag/warm --index runs/rag/index.sqlite
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.calc.warm_start import train_and_save
from examples.rag.agent import INSTRUCTIONS
from examples.rag.corpus import Task, make_splits, make_world
from examples.rag.index import SearchIndex, format_results
from examples.rag.search_server import SEARCH_TOOL

__all__ = ["CHAT_TOOL", "WarmStartConfig", "corpus", "solution", "warm_start"]

logger = logging.getLogger(__name__)

CHAT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SEARCH_TOOL["name"],
        "parameters": SEARCH_TOOL["inputSchema"],
        "description": SEARCH_TOOL["description"],
    },
}
"""The search tool as the gateway hands it to the chat template (the Responses API's function tool
in chat form, in the gateway's key order): the warm start renders exactly what rollouts see."""


@dataclass(frozen=True)
class WarmStartConfig:
    """How long and how hard the warm start trains, and how often its solutions search to the end."""

    full_fraction: float = 0.2
    full_steps: int = 1200
    steps: int = 1500
    batch_size: int = 16
    learning_rate: float = 2e-3
    seed: int = 0


def solution(task: Task, index: SearchIndex, searches: int | None = None) -> list[dict[str, Any]]:
    """A worked solution of ``task`` as the RAG agent's conversation: its first ``searches`` hops
    (all by default), then the answer the last one gave.

    >>> import pathlib, tempfile
    >>> from examples.rag.index import build_index
    >>> world = make_world(0, people=4, companies=2, cities=2, countries=2)
    >>> index = SearchIndex(build_index(pathlib.Path(tempfile.mkdtemp()) / "i.sqlite", world.passages))
    >>> task = world.questions(sorted(world.born_in)[0])[0]
    >>> [m["role"] for m in solution(task, index)]
    ['system', 'user', 'assistant', 'tool', 'assistant', 'tool', 'assistant']
    >>> solution(task, index)[-1]["content"] == f"Answer: {task['answer']}"
    True
    >>> solution(task, index, 1)[-1]["content"] == f"Answer: {task['hops'][0]['found']}"
    True
    """
    hops = task["hops"][:searches] if searches is not None else task["hops"]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": task["question"]},
    ]
    for number, hop in enumerate(hops):
        call_id = f"call_{number}"
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"query": hop["query"]})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": format_results(index.search(hop["query"]))}
        )
    messages.append({"role": "assistant", "content": f"Answer: {hops[-1]['found']}"})
    return messages


def corpus() -> list[str]:
    """Texts of the task for the tokenizer to learn from (``fulgor model init --corpus``): the
    agent's instructions, its tool's definition, and the words around the names in questions,
    passages, queries and answers, but no name.

    Left out of the corpus, a name is cut into the pieces the tokenizer learned from its own
    synthetic texts, pieces that all names share: copying a name the model has never seen (from a
    question into a query, from a passage into the next query or the answer) is copying ids it
    has seen many times. Learned whole, a held-out name would be one id the model never wrote.
    """
    frames = [
        "In which country was born?",
        "In which city is the company works for based?",
        "In which country is the company works for based?",
        "was born in.",
        "works for.",
        "is based in.",
        "is a city in.",
        "no passage matches",
        "Answer:",
        *(
            json.dumps({"name": "search", "arguments": {"query": f" {word}"}})
            for word in ("born", "works", "based", "city")
        ),
    ]
    return [INSTRUCTIONS, json.dumps(CHAT_TOOL["function"])] * 50 + frames * 50


def warm_start(
    base: str | Path,
    out: str | Path,
    tasks: Sequence[Task],
    index_path: str | Path,
    config: WarmStartConfig | None = None,
) -> Path:
    """Fine-tune the model in ``base`` on synthetic solutions of ``tasks``; save it to ``out``.

    The solutions go the way of SFT's distillation, as the calc warm start's do
    (:func:`examples.calc.warm_start.warm_start`): rendered with the model's own chat template,
    checked to parse back as the engine parses the model's output, learned by the same update.
    """
    import torch

    from fulgor.adapters.transcripts import Transcript
    from fulgor.algorithms.sft import SFTConfig, SFTUpdater
    from fulgor.algorithms.sft.distill import teacher_data
    from fulgor.weights.loading import eos_token_ids
    from fulgor.weights.policy import load_policy

    config = config or WarmStartConfig()
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    index = SearchIndex(index_path)
    policy = load_policy(Path(base), "cpu")
    updater = SFTUpdater(policy.model, SFTConfig(learning_rate=config.learning_rate))
    stops = eos_token_ids(policy.model, policy.tokenizer)
    # Every task's solutions, rendered once: [task][searches - 1], the last one searching to the end.
    transcripts = [
        [
            Transcript.of(solution(task, index, searches), [CHAT_TOOL], name=f"task-{number}-{searches}")
            for searches in range(1, len(task["hops"]) + 1)
        ]
        for number, task in enumerate(tasks)
    ]
    flat = [transcript for per_task in transcripts for transcript in per_task]
    rendered = teacher_data(flat, policy.tokenizer, stop_token_ids=stops)
    if rendered.unusable:
        raise ValueError(f"the warm start's solutions do not render faithfully: {rendered.summary()}")
    solutions: list[list[Any]] = []
    offset = 0
    for per_task in transcripts:
        solutions.append(rendered.trajectories[offset : offset + len(per_task)])
        offset += len(per_task)

    def batch(step: int) -> list[Any]:
        fraction = 1.0 if step <= config.full_steps else config.full_fraction
        chosen = []
        for number in rng.sample(range(len(tasks)), config.batch_size):
            options = solutions[number]
            full = rng.random() < fraction
            chosen.append(options[-1] if full else options[rng.randrange(len(options) - 1)])
        return chosen

    return train_and_save(
        policy, updater, Path(out), steps=config.steps, first_steps=config.full_steps, batch=batch
    )


def main(argv: list[str] | None = None) -> int:
    from examples.rag.index import build_index

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True, help="the model directory to start from")
    parser.add_argument("--out", type=Path, required=True, help="where to save the warm-started model")
    parser.add_argument("--index", type=Path, required=True, help="the search index (built if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=WarmStartConfig.steps)
    parser.add_argument("--full-steps", type=int, default=WarmStartConfig.full_steps)
    parser.add_argument("--full-fraction", type=float, default=WarmStartConfig.full_fraction)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    world = make_world(args.seed)
    build_index(args.index, world.passages)
    config = WarmStartConfig(
        full_fraction=args.full_fraction, full_steps=args.full_steps, steps=args.steps, seed=args.seed
    )
    warm_start(args.model, args.out, make_splits(world, args.seed)["train"], args.index, config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
