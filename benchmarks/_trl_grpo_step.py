"""The TRL side of ``benchmarks/grpo_step.py``: timed ``GRPOTrainer`` update steps on a fixed batch.

Run with the python of the ``.bench/trl-<version>`` virtual environment (never fulgor's)::

    .bench/trl-1.16.0/bin/python benchmarks/_trl_grpo_step.py SPEC.json

``SPEC.json`` (written by ``benchmarks/grpo_step.py``) names the model directory, the torch thread
count, the optimiser settings, the number of steps, and the batch: for each group, the prompt's token
ids and, per completion, its token ids, sampled logprobs and reward. Prints one JSON object on stdout::

    {"trl": "1.16.0", "threads": [1], "attn_implementation": "sdpa", "checkpointing": false, "seconds": [..],
     "cpu_seconds": [..], "excluded_seconds": [..], "trained_tokens": [..], "width": [..]}

with one value per timed step: wall-clock and CPU seconds (of this process), the wall-clock seconds
put aside, the completion tokens under TRL's loss mask, and the padded width of the rows (longest
prompt + longest completion: TRL left-pads prompts and right-pads completions).

How the batch reaches TRL: through ``GRPOTrainer``'s own ``rollout_func`` hook, which returns the
pre-generated prompt and completion ids (and their logprobs) for the prompts TRL's sampler hands it,
and a reward function that returns the pre-set rewards. Everything else is TRL's ``train()`` loop as
a user runs it: its sampler, ``_generate_and_score_completions`` (decoding, rewards, advantages,
padding), ``training_step`` per micro-batch (``compute_loss`` with its fused LM head, backward),
gradient clipping, ``optimizer.step()``, the scheduler step and ``zero_grad``.

What is timed, per optimiser step: from the ``on_step_begin`` callback (before the first micro-batch)
to ``on_step_end`` (after ``zero_grad``), minus the time spent inside
``_generate_and_score_completions``, measured by a subclass that only wraps it. So the figure is the
loss forward, backward and optimiser step with TRL's per-micro-batch bookkeeping, and none of its
generation, decoding, reward or advantage work (the excluded seconds are reported separately).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _completions_for(spec: dict[str, Any]) -> tuple[dict[str, int], Any]:
    """The dataset prompts (one per group) and a ``rollout_func`` that returns the fixed batch."""
    groups = spec["groups"]
    index = {f"group {g}": g for g in range(len(groups))}

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        # TRL hands each group's prompt once per generation; the k-th copy gets the k-th completion.
        seen: dict[int, int] = {}
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "preset_reward": [],
        }
        for prompt in prompts:
            g = index[prompt]
            k = seen.get(g, 0)
            seen[g] = k + 1
            completion = groups[g]["completions"][k]
            out["prompt_ids"].append(list(groups[g]["prompt_ids"]))
            out["completion_ids"].append(list(completion["ids"]))
            out["logprobs"].append(list(completion["logprobs"]))
            out["preset_reward"].append(completion["reward"])
        return out

    return index, rollout_func


def preset_reward(
    prompts: list[Any], completions: list[Any], preset_reward: list[float], **_: Any
) -> list[float]:
    """The reward each completion was given when the batch was made."""
    return list(preset_reward)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(spec["threads"])
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    transformers.logging.set_verbosity_error()
    steps: list[dict[str, float]] = []
    threads_seen: set[int] = set()

    def clocks() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    class TimedGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        """GRPOTrainer, with the time inside ``_generate_and_score_completions`` put aside."""

        excluded = (0.0, 0.0)
        tokens = 0
        width = 0

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            wall, cpu = clocks()
            output = super()._generate_and_score_completions(inputs)
            now_wall, now_cpu = clocks()
            self.excluded = (self.excluded[0] + now_wall - wall, self.excluded[1] + now_cpu - cpu)
            self.tokens += int(output["completion_mask"].sum())
            self.width = output["prompt_ids"].shape[1] + output["completion_ids"].shape[1]
            return output

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        began = (0.0, 0.0)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            threads_seen.add(torch.get_num_threads())
            trainer.excluded, trainer.tokens = (0.0, 0.0), 0
            self.began = clocks()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            wall, cpu = clocks()
            steps.append(
                {
                    "seconds": wall - self.began[0] - trainer.excluded[0],
                    "cpu_seconds": cpu - self.began[1] - trainer.excluded[1],
                    "excluded_seconds": trainer.excluded[0],
                    "trained_tokens": trainer.tokens,
                    "width": trainer.width,
                }
            )

    prompts, rollout_func = _completions_for(spec)
    n_steps = spec["warmup_steps"] + spec["steps"]
    args = trl.GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=False,  # fp32 on both sides
        gradient_checkpointing=False,  # fulgor does not recompute activations either
        per_device_train_batch_size=spec["micro_batch_size"],
        gradient_accumulation_steps=spec["gradient_accumulation_steps"],
        num_generations=spec["group_size"],
        max_completion_length=spec["max_completion_tokens"],
        max_steps=n_steps,
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        optim="adamw_torch",  # torch.optim.AdamW, as fulgor's PolicyUpdater
        max_grad_norm=spec["max_grad_norm"],
        loss_type="grpo",  # mean over each sequence's tokens, then over sequences: fulgor's normalisation
        scale_rewards="group",
        beta=0.0,
        epsilon=0.2,
        num_iterations=1,
        logging_steps=10 * n_steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(
        spec["model_dir"], dtype=torch.float32, attn_implementation=spec["attn_implementation"]
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=preset_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(prompts)}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
        callbacks=[StepTimer()],
    )
    trainer.train()
    timed = steps[spec["warmup_steps"] :]
    result = {key: [step[key] for step in timed] for key in timed[0]}
    result.update(
        trl=trl.__version__,
        threads=sorted(threads_seen),
        attn_implementation=model.config._attn_implementation,
        checkpointing=any(getattr(module, "gradient_checkpointing", False) for module in model.modules()),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
