"""The TRL side of ``benchmarks/grpo_step.py --parts reward``: ``GRPOTrainer`` for a wall-time budget.

Run with the python of the ``.bench/trl-<version>`` virtual environment (never fulgor's), by
``benchmarks/_grpo_reward.py``, which answers reward requests on this process's stdin::

    .bench/trl-1.16.0/bin/python benchmarks/_trl_grpo_reward.py SPEC.json

``SPEC.json`` names the starting model, the output directory for the final weights, the torch thread
count, the budget in seconds, the GRPO settings (group size, prompts per step, learning rate,
sampling, clipping) and the training prompts: each task's prompt as text (the chat template's
rendering, with the calculator tool and the generation prompt), its ids as fulgor's engine encodes
that prompt, and its answer, plus the order in which steps take them (fulgor's order, so that both
sides train on the same prompts in the same order).

The reward is ``examples.calc.single_turn.completion_reward`` on each decoded completion. It needs
fulgor, which this environment lacks, so the reward function sends the completions and answers as a
JSON line on stdout and reads the rewards back as a JSON line on stdin: the parent computes them
with that very function (a few milliseconds per step, inside this side's clock). Everything the
libraries print goes to stderr; stdout carries only these lines and, last, the result::

    {"result": {"trl": "1.16.0", "threads": [1], "steps": K, "elapsed_seconds": s, "sampled_tokens": n,
                "step_rewards": [..], "step_seconds": [..], "wall_seconds": s, "cpu_seconds": s}}

How the budget is kept: the clock starts before the model is loaded and the ``GRPOTrainer`` is built
(after the imports) and is read by a ``TrainerCallback`` at every ``on_step_end`` (after the
optimiser step). Each step that ends within the budget keeps an in-memory copy of the weights; the
first step that ends past it stops training (``control.should_training_stop``), and the weights of
the last step within the budget are saved. ``steps`` counts those steps, ``elapsed_seconds`` is when
the last of them ended, and ``sampled_tokens`` the completion tokens (up to and including EOS) that
they generated; ``wall_seconds`` and ``cpu_seconds`` cover the whole run, the step past the budget
included.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _check_prompt_ids(tokenizer: Any, tasks: list[dict[str, Any]]) -> None:
    """TRL encodes text prompts with ``processing_class(text=prompts)``: it must give the engine's ids."""
    encoded = tokenizer(text=[task["prompt"] for task in tasks])["input_ids"]
    for task, ids in zip(tasks, encoded, strict=True):
        if list(ids) != task["prompt_ids"]:
            raise RuntimeError(f"TRL encodes {task['prompt']!r} to other ids than fulgor's engine")


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    channel = os.fdopen(os.dup(1), "w")  # the protocol; whatever the libraries print goes to stderr
    os.dup2(2, 1)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(spec["threads"])
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    transformers.logging.set_verbosity_error()
    tasks = spec["tasks"]
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    _check_prompt_ids(tokenizer, tasks)
    dataset = Dataset.from_dict(
        {
            "prompt": [tasks[i]["prompt"] for i in spec["order"]],
            "answer": [tasks[i]["answer"] for i in spec["order"]],
        }
    )
    step_rewards: list[float] = []
    threads_seen: set[int] = set()

    def calc_reward(prompts: list[str], completions: list[str], answer: list[int], **_: Any) -> list[float]:
        """``completion_reward(text, answer)`` of each completion, computed by the parent process."""
        channel.write(json.dumps({"completions": completions, "answers": answer}) + "\n")
        channel.flush()
        rewards: list[float] = json.loads(sys.stdin.readline())["rewards"]
        step_rewards.append(sum(rewards) / len(rewards))
        return rewards

    class CountingGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        """GRPOTrainer, counting the completion tokens it generates."""

        sampled_tokens = 0

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            output = super()._generate_and_score_completions(inputs)
            self.sampled_tokens += int(output["completion_mask"].sum())
            return output

    kept: dict[str, Any] = {"steps": 0, "elapsed_seconds": 0.0, "sampled_tokens": 0, "weights": None}
    step_seconds: list[float] = []

    class Budget(TrainerCallback):  # type: ignore[misc]
        """Keeps the weights of each step that ends within the budget; stops at the first that does not."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            threads_seen.add(torch.get_num_threads())
            elapsed = time.perf_counter() - started
            if elapsed > spec["budget_seconds"]:
                control.should_training_stop = True
                return control
            step_seconds.append(elapsed)
            weights = {name: value.detach().clone() for name, value in model.state_dict().items()}
            kept.update(
                steps=state.global_step,
                elapsed_seconds=elapsed,
                sampled_tokens=trainer.sampled_tokens,
                weights=weights,
            )
            return control

    args = trl.GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=False,  # fp32, as fulgor
        gradient_checkpointing=False,  # fulgor does not recompute activations either
        per_device_train_batch_size=spec["micro_batch_size"],
        gradient_accumulation_steps=spec["gradient_accumulation_steps"],
        num_generations=spec["group_size"],
        max_completion_length=spec["max_completion_tokens"],
        temperature=spec["temperature"],
        top_p=spec["top_p"],
        top_k=0,  # no top-k filtering: fulgor's engine samples from the whole distribution
        max_steps=spec["max_steps"],
        shuffle_dataset=False,  # the dataset is already in fulgor's step order
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=spec["weight_decay"],
        optim="adamw_torch",  # torch.optim.AdamW, as fulgor's PolicyUpdater
        max_grad_norm=spec["max_grad_norm"],
        loss_type="grpo",  # mean over each sequence's tokens, then over sequences: fulgor's normalisation
        scale_rewards="group",
        beta=0.0,
        epsilon=spec["clip_low"],
        epsilon_high=spec["clip_high"],
        num_iterations=1,
        logging_steps=spec["max_steps"],
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=spec["seed"],
    )
    started = time.perf_counter()
    cpu_started = time.process_time()
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    trainer = CountingGRPOTrainer(
        model=model,
        reward_funcs=calc_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Budget()],
    )
    trainer.train()
    wall_seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if kept["weights"] is not None:
        model.load_state_dict(kept["weights"])
    model.save_pretrained(spec["out_dir"])
    tokenizer.save_pretrained(spec["out_dir"])
    result = {
        "trl": trl.__version__,
        "threads": sorted(threads_seen),
        "steps": kept["steps"],
        "elapsed_seconds": kept["elapsed_seconds"],
        "sampled_tokens": kept["sampled_tokens"],
        "step_rewards": step_rewards[: kept["steps"]],
        "step_seconds": step_seconds,
        "wall_seconds": wall_seconds,
        "cpu_seconds": cpu_seconds,
    }
    channel.write(json.dumps({"result": result}) + "\n")
    channel.flush()


if __name__ == "__main__":
    main()
