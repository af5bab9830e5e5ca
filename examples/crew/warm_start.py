"""The crew's warm start: a short SFT on synthetic crew runs, so the model knows both agents' formats.

A freshly built model writes noise; GRPO needs the crew to succeed sometimes before it can learn
from its own rollouts. The warm start shows the model worked runs of training problems in the exact
conversations CrewAI holds with each agent (:mod:`examples.crew.prompts`; a test holds them to what
the gateway records): the solver's, which either calls the calculator and replies with its result,
or replies with the right number at once, and the reporter's, which reads the solver's reply as its
context and states it as ``Answer: N``.

As in the calc warm start (:mod:`examples.calc.warm_start`), for the first ``tool_steps`` steps
every solver calls the calculator (the model learns to copy the operands into the call and the
result into its reply); for the rest, a solver calls it with probability ``tool_fraction`` only.
The model ends up knowing the tool but mostly answering without it, so guessing; GRPO then finds
out from the rewards that calling it pays.

    python -m examples.crew.warm_start --model runs/crew/base --out runs/crew/warm
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

from examples.calc.dataset import Task, make_splits
from examples.calc.warm_start import WarmStartConfig as CalcWarmStartConfig
from examples.calc.warm_start import task_texts, tool_exchange, train_and_save
from examples.crew.prompts import (
    CALCULATOR_TOOL,
    REPORTER,
    REPORTER_TASK,
    SOLVER,
    SOLVER_TASK,
    conversation_start,
)

__all__ = ["WarmStartConfig", "corpus", "reporter_conversation", "solver_conversation", "warm_start"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStartConfig(CalcWarmStartConfig):
    """The calc warm start's settings, with the crew's lengths: its solver learns to copy the
    calculator's result only after about 1,500 all-tool steps."""

    tool_steps: int = 2000
    steps: int = 2300
    batch_size: int = 8


def solver_conversation(task: Task, use_tool: bool) -> list[dict[str, Any]]:
    """The solver's conversation on ``task``, ending on its reply: the number.

    >>> [m["role"] for m in solver_conversation({"question": "What is 3 times 4?", "answer": 12,
    ...                                           "a": 3, "b": 4, "op": "*"}, use_tool=True)]
    ['system', 'user', 'assistant', 'tool', 'assistant']
    """
    messages = conversation_start(SOLVER, task["question"], SOLVER_TASK["expected_output"])
    if use_tool:
        messages += tool_exchange(task, named=True)
    messages.append({"role": "assistant", "content": str(task["answer"])})
    return messages


def reporter_conversation(context: str, answer: str) -> list[dict[str, Any]]:
    """The reporter's conversation, given the solver's reply as ``context``, ending on its answer."""
    messages = conversation_start(
        REPORTER, REPORTER_TASK["description"], REPORTER_TASK["expected_output"], context=context
    )
    messages.append({"role": "assistant", "content": f"Answer: {answer}"})
    return messages


def corpus(tasks: Sequence[Task]) -> list[str]:
    """Texts for the tokenizer to learn from (``fulgor model init --corpus``): both agents' opening
    messages, the tool's definition, and each task's question, tool call and answers."""
    frames = [m["content"] for m in conversation_start(SOLVER, "", SOLVER_TASK["expected_output"])]
    frames += [m["content"] for m in reporter_conversation("", "")]
    texts = [*frames, json.dumps(CALCULATOR_TOOL["function"])] * 50
    for task in tasks:
        texts += task_texts(task)
    return texts


def warm_start(
    base: str | Path, out: str | Path, tasks: Sequence[Task], config: WarmStartConfig | None = None
) -> Path:
    """Fine-tune the model in ``base`` on synthetic crew runs of ``tasks``; save it to ``out``.

    Each step learns ``batch_size`` tasks' runs: the solver's conversation and the reporter's, each
    a transcript rendered with the model's own chat template and checked to render faithfully.
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
    policy = load_policy(Path(base), "cpu")
    updater = SFTUpdater(policy.model, SFTConfig(learning_rate=config.learning_rate))
    stops = eos_token_ids(policy.model, policy.tokenizer)
    # Every task's three conversations, rendered once: solver without the tool, with it, reporter.
    transcripts = []
    for index, task in enumerate(tasks):
        name = f"task-{index}"
        transcripts += [
            Transcript.of(solver_conversation(task, False), [CALCULATOR_TOOL], name=f"{name}-solver"),
            Transcript.of(solver_conversation(task, True), [CALCULATOR_TOOL], name=f"{name}-solver-tool"),
            Transcript.of(
                reporter_conversation(str(task["answer"]), str(task["answer"])), name=f"{name}-reporter"
            ),
        ]
    rendered = teacher_data(transcripts, policy.tokenizer, stop_token_ids=stops)
    if rendered.unusable:
        raise ValueError(f"the warm start's conversations do not render faithfully: {rendered.summary()}")
    runs = [rendered.trajectories[i : i + 3] for i in range(0, len(rendered.trajectories), 3)]

    def batch(step: int) -> list[Any]:
        fraction = 1.0 if step <= config.tool_steps else config.tool_fraction
        rows = []
        for index in rng.sample(range(len(tasks)), config.batch_size):
            without_tool, with_tool, reporter = runs[index]
            rows += [with_tool if rng.random() < fraction else without_tool, reporter]
        return rows

    return train_and_save(
        policy, updater, Path(out), steps=config.steps, first_steps=config.tool_steps, batch=batch
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True, help="the model directory to start from")
    parser.add_argument("--out", type=Path, required=True, help="where to save the warm-started model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=WarmStartConfig.steps)
    parser.add_argument("--tool-steps", type=int, default=WarmStartConfig.tool_steps)
    parser.add_argument("--tool-fraction", type=float, default=WarmStartConfig.tool_fraction)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = WarmStartConfig(
        tool_fraction=args.tool_fraction, tool_steps=args.tool_steps, steps=args.steps, seed=args.seed
    )
    warm_start(args.model, args.out, make_splits(args.seed)["train"], config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
