"""The calc warm start: a short SFT on synthetic solutions, so the model knows the tool format.

A freshly built model writes noise; GRPO needs it to succeed sometimes before it can learn from its
own rollouts. The warm start shows it worked solutions of training problems, in the calc agent's
exact conversation (its system prompt, the calculator tool, the engine's chat template), of two
kinds: a solution that calls the calculator, reads the result and replies with it, and one that
replies with the right number at once. A model this small cannot multiply two-digit numbers in its
head, so on new problems that second habit is a guess.

It runs in two phases. For the first ``tool_steps`` steps every solution uses the calculator: a
model this small (under a million parameters) needs several hundred steps of them to learn to copy
the operands into the call and the result into the answer. For the rest, a solution uses it with probability
``tool_fraction`` only: the model ends up knowing the tool format, but mostly answering without
it, and mostly wrong. GRPO then finds out from the rewards that calling the tool pays.

    python -m examples.calc.warm_start --model runs/calc/base --out runs/calc/warm
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.calc.agent import CALCULATOR_TOOL, SYSTEM_PROMPT, calculate
from examples.calc.dataset import Task, make_splits
from fulgor.weights.lora import LoraConfig

__all__ = [
    "WarmStartConfig",
    "corpus",
    "solution",
    "task_texts",
    "tool_exchange",
    "train_and_save",
    "warm_start",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStartConfig:
    """How long and how hard the warm start trains, and how often its solutions use the tool."""

    tool_fraction: float = 0.25
    tool_steps: int = 1000
    steps: int = 1150
    batch_size: int = 16
    learning_rate: float = 2e-3
    seed: int = 0
    lora: LoraConfig | None = None
    """Train a LoRA adapter (saved alone, over the base it names) instead of every weight."""
    compute_dtype: str = "float32"
    """``bfloat16``: the forward and backward under bfloat16 autocast (:class:`SFTConfig`)."""


def solution(task: Task, use_tool: bool) -> list[dict[str, Any]]:
    """A worked solution of ``task`` as the calc agent's conversation.

    >>> [m["role"] for m in solution({"question": "What is 3 times 4?", "answer": 12,
    ...                               "a": 3, "b": 4, "op": "*"}, use_tool=True)]
    ['system', 'user', 'assistant', 'tool', 'assistant']
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    if use_tool:
        messages += tool_exchange(task)
    messages.append({"role": "assistant", "content": f"Answer: {task['answer']}"})
    return messages


def tool_exchange(task: Task, *, named: bool = False) -> list[dict[str, Any]]:
    """The calculator's call on ``task``'s operands and its result, as the assistant's and the tool's
    messages (with ``named``, the tool's message names the tool, as CrewAI writes it)."""
    expression = f"{task['a']}{task['op']}{task['b']}"
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
    }
    result: dict[str, Any] = {"role": "tool", "tool_call_id": "call_0", "content": calculate(expression)}
    if named:
        result["name"] = "calculator"
    return [{"role": "assistant", "content": None, "tool_calls": [call]}, result]


def corpus(tasks: Sequence[Task], tool: Mapping[str, Any] = CALCULATOR_TOOL) -> list[str]:
    """Texts of the task for the tokenizer to learn from (``fulgor model init --corpus``).

    The agent's system prompt, its tool's definition (``tool``, as the agent offers it to the
    model), and each task's question, tool call and result: with a vocabulary fitted to them, a
    conversation takes about a third of the tokens.
    """
    texts = [SYSTEM_PROMPT, json.dumps(tool["function"])] * 50
    for task in tasks:
        texts += task_texts(task)
    return texts


def task_texts(task: Task) -> list[str]:
    """A task's texts for the tokenizer: its question, the calculator call and the answer."""
    expression = f"{task['a']}{task['op']}{task['b']}"
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return [task["question"], call, f"Answer: {task['answer']}"]


def warm_start(
    base: str | Path,
    out: str | Path,
    tasks: Sequence[Task],
    config: WarmStartConfig | None = None,
    *,
    tool: Mapping[str, Any] = CALCULATOR_TOOL,
    chat_template: str | None = None,
) -> Path:
    """Fine-tune the model in ``base`` on synthetic solutions of ``tasks``; save it to ``out``.

    ``tool`` is the calculator's definition as the agent offers it to the model (the chat template
    writes it into the prompt): the openai-SDK agent's by default, another agent's (AutoGen adds
    ``additionalProperties`` and ``strict``) for the conversations that agent has.
    ``chat_template`` (a file, or a name fulgor ships: ``--chat-template``) renders the solutions
    instead of the model's own template, and is saved with the model, as the engine serves it with.

    The solutions go the way of SFT's distillation (:mod:`fulgor.algorithms.sft.distill`): each is
    a chat transcript, rendered with the model's own chat template and checked to render faithfully
    (its tool call and answer parse back as the engine parses the model's output), then learned by
    the same update.
    """
    import torch

    from fulgor.adapters.transcripts import Transcript
    from fulgor.algorithms.sft import SFTConfig, SFTUpdater
    from fulgor.algorithms.sft.distill import teacher_data
    from fulgor.engine.chat_format import read_chat_template
    from fulgor.weights.loading import eos_token_ids
    from fulgor.weights.policy import load_policy

    config = config or WarmStartConfig()
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    policy = load_policy(Path(base), "cpu", lora=config.lora)
    if chat_template is not None:
        policy.tokenizer.chat_template = read_chat_template(chat_template)
    sft = SFTConfig(learning_rate=config.learning_rate, compute_dtype=config.compute_dtype)
    updater = SFTUpdater(policy.model, sft)
    stops = eos_token_ids(policy.model, policy.tokenizer)  # where the engine ends a turn
    # Every task's two solutions, rendered once: [task][use_tool].
    transcripts = [
        Transcript.of(solution(task, use_tool), [dict(tool)], name=f"task-{index}-tool-{use_tool}")
        for index, task in enumerate(tasks)
        for use_tool in (False, True)
    ]
    rendered = teacher_data(transcripts, policy.tokenizer, stop_token_ids=stops)
    if rendered.unusable:
        raise ValueError(f"the warm start's solutions do not render faithfully: {rendered.summary()}")
    solutions = [rendered.trajectories[i : i + 2] for i in range(0, len(rendered.trajectories), 2)]
    # A short linear warm-up, the full rate while every solution uses the tool, then a decay to a
    # quarter: the second phase sets how often the model reaches for the tool without unlearning how.

    def batch(step: int) -> list[Any]:
        tasks_of_step = rng.sample(range(len(tasks)), config.batch_size)
        fraction = 1.0 if step <= config.tool_steps else config.tool_fraction
        return [solutions[index][rng.random() < fraction] for index in tasks_of_step]

    return train_and_save(
        policy, updater, Path(out), steps=config.steps, first_steps=config.tool_steps, batch=batch
    )


def train_and_save(
    policy: Any, updater: Any, out: Path, *, steps: int, first_steps: int, batch: Callable[[int], list[Any]]
) -> Path:
    """The warm starts' loop: ``steps`` SFT steps on ``batch(step)``, at a rate with a short linear
    warm-up (a fresh model's first gradients are wild), the full rate for the first ``first_steps``
    steps, then a decay to a quarter; the model saved to ``out`` whole or not at all."""
    import torch

    warmup = max(1, steps // 20)

    def scale(step: int) -> float:
        if step < first_steps:
            return min(1.0, (step + 1) / warmup)
        return 1.0 - 0.75 * (step - first_steps) / max(1, steps - first_steps)

    schedule = torch.optim.lr_scheduler.LambdaLR(updater.optimizer, scale)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        metrics = updater.step(batch(step))
        schedule.step()
        if step % 25 == 0 or step == steps:
            logger.info("warm start step %d/%d: loss %.4f", step, steps, metrics["loss"])
    partial = out.with_name(f".{out.name}.partial")  # complete or absent: a rerun never finds half a model
    shutil.rmtree(partial, ignore_errors=True)
    policy.model.save_pretrained(partial)
    policy.tokenizer.save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    seconds = time.perf_counter() - started
    logger.info("warm start: %d steps in %.0fs, saved to %s", steps, seconds, out)
    return out


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
