"""The TRL side of ``benchmarks/sft.py --parts throughput``: timed ``SFTTrainer`` steps on fixed rows.

Run with the python of the ``.bench/trl-<version>`` virtual environment (never fulgor's)::

    .bench/trl-1.16.0/bin/python benchmarks/_trl_sft_step.py SPEC.json

``SPEC.json`` (written by ``benchmarks/sft.py``) names the model directory, the torch thread count,
the optimiser settings, the number of steps and the rows: each row's token ids and loss mask (1 on
the tokens to learn). They reach TRL as a pre-tokenized dataset (``input_ids``, and ``labels`` with
-100 where the mask is 0), one optimiser step per pass over all rows, in micro-batches of
``micro_batch_size`` (gradient accumulation over the rest, no shuffling needed: every step sees
every row). Everything else is ``SFTTrainer.train()`` as a user runs it. Prints one JSON object::

    {"trl": "1.16.0", "threads": [1], "attn_implementation": "sdpa", "checkpointing": false,
     "seconds": [..], "cpu_seconds": [..], "trained_tokens": [..]}

with one value per timed step, from the ``on_step_begin`` callback to ``on_step_end``: the
micro-batches' forward, loss and backward, clipping, the optimiser and scheduler steps. The
dataloader's collation of the first micro-batch of a step runs before ``on_step_begin`` (the
Trainer fetches a step's batches first) and is not timed: a small bias in TRL's favour.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


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
    rows = spec["rows"]
    steps: list[dict[str, float]] = []
    threads_seen: set[int] = set()
    tokens = {"trained": 0}

    def clocks() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    class CountingSFTTrainer(trl.SFTTrainer):  # type: ignore[misc]
        """SFTTrainer, counting the tokens under its loss (labels other than -100, after the shift)."""

        def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            tokens["trained"] += int((inputs["labels"][:, 1:] != -100).sum())
            return super().compute_loss(model, inputs, *args, **kwargs)

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        began = (0.0, 0.0)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            threads_seen.add(torch.get_num_threads())
            tokens["trained"] = 0
            self.began = clocks()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            wall, cpu = clocks()
            steps.append(
                {
                    "seconds": wall - self.began[0],
                    "cpu_seconds": cpu - self.began[1],
                    "trained_tokens": tokens["trained"],
                }
            )

    n_steps = spec["warmup_steps"] + spec["steps"]
    dataset = Dataset.from_dict(
        {
            "input_ids": [row["token_ids"] for row in rows],
            "labels": [
                [t if m else -100 for t, m in zip(row["token_ids"], row["loss_mask"], strict=True)]
                for row in rows
            ],
        }
    )
    args = trl.SFTConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=False,  # fp32 on both sides
        gradient_checkpointing=False,  # fulgor does not recompute activations either
        per_device_train_batch_size=spec["micro_batch_size"],
        gradient_accumulation_steps=len(rows) // spec["micro_batch_size"],
        max_steps=n_steps,
        num_train_epochs=n_steps,
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        optim="adamw_torch",  # torch.optim.AdamW, as fulgor's SFTUpdater
        max_grad_norm=spec["max_grad_norm"],
        max_length=None,
        packing=False,
        padding_free=False,
        logging_steps=10 * n_steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_drop_last=False,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(
        spec["model_dir"], dtype=torch.float32, attn_implementation=spec["attn_implementation"]
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    trainer = CountingSFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[StepTimer()]
    )
    trainer.train()
    timed = steps[spec["warmup_steps"] :]
    result: dict[str, Any] = {key: [step[key] for step in timed] for key in timed[0]}
    result.update(
        trl=trl.__version__,
        threads=sorted(threads_seen),
        attn_implementation=model.config._attn_implementation,
        checkpointing=any(getattr(module, "gradient_checkpointing", False) for module in model.modules()),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
