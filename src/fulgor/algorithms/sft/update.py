"""Supervised fine-tuning: maximise the likelihood of the tokens under loss mask 1.

It trains on the same :class:`~fulgor.adapters.trajectory.TrajectoryRow` the adapter builds from
real rollouts (so the best trajectories can be fine-tuned on exactly as they were sampled), or on
rows made from chat transcripts with :func:`chat_row` (a warm start on synthetic solutions), and it
shares batching and log-probabilities with the GRPO update. What it does not know: where rows come
from, or when to stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fulgor.adapters.trajectory import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo.update import collate, token_logprobs
from fulgor.errors import ConfigError

__all__ = ["SFTConfig", "SFTUpdater", "chat_row"]


@dataclass(frozen=True)
class SFTConfig:
    """How the fine-tuning step behaves."""

    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    micro_batch_size: int = 16
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.micro_batch_size < 1:
            raise ConfigError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")


def chat_row(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> TrajectoryRow:
    """A training row from a chat transcript: the assistant turns are trained on, the rest is context.

    The row is the chat template's rendering of the whole transcript; the tokens each assistant turn
    adds (its prefix rendering versus the one before it) get mask 1. A template that is not
    append-only (one that re-renders earlier turns) is refused, since its rows would not match what
    the engine sees when it serves the same conversation turn by turn.
    """
    token_ids: list[int] = []
    loss_mask: list[int] = []
    for end in range(1, len(messages) + 1):
        ids = _render(tokenizer, messages[:end], tools)
        if ids[: len(token_ids)] != token_ids:
            raise ConfigError(
                "the chat template re-renders earlier turns; chat_row needs an append-only template"
            )
        trained = 1 if messages[end - 1].get("role") == "assistant" else 0
        loss_mask += [trained] * (len(ids) - len(token_ids))
        token_ids = ids
    return TrajectoryRow(
        token_ids=token_ids,
        loss_mask=loss_mask,
        sampled_logprobs=[0.0] * len(token_ids),
        calls=[],
        returns=[0.0] * len(token_ids),
    )


def _render(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[int]:
    encoded = tokenizer.apply_chat_template(list(messages), tools=tools, tokenize=True)
    ids = encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


class SFTUpdater:
    """Owns the optimiser; ``step`` applies one fine-tuning update to ``model`` in place."""

    def __init__(self, model: Any, config: SFTConfig | None = None) -> None:
        import torch

        self.model = model
        self.config = config or SFTConfig()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )

    def step(self, rows: Sequence[TrajectoryRow]) -> dict[str, float]:
        """One update: the mean negative log-likelihood over every trained token of ``rows``."""
        import torch

        if not any(row.trained_tokens for row in rows):
            raise ConfigError("no row has a token under loss mask 1; nothing to fine-tune on")
        device = next(self.model.parameters()).device
        batch = collate(
            [Trajectory(rollout_id="sft", group_id=None, reward=0.0, rows=list(rows), model_versions=[])]
        )
        batch = batch.to(device)
        total = batch.loss_mask.sum()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for start in range(0, batch.input_ids.shape[0], self.config.micro_batch_size):
            part = slice(start, start + self.config.micro_batch_size)
            logprobs, _ = token_logprobs(self.model, batch.input_ids[part], batch.attention_mask[part])
            loss = -(logprobs * batch.loss_mask[part]).sum() / total
            loss.backward()  # type: ignore[no-untyped-call]
            loss_sum += float(loss.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        return {"loss": loss_sum, "grad_norm": float(grad_norm), "trained_tokens": float(total)}
