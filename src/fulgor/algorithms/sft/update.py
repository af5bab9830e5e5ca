"""Supervised fine-tuning: maximise the likelihood of the tokens under loss mask 1.

It trains on the same :class:`~fulgor.adapters.trajectory.TrajectoryRow` the adapter builds from
real rollouts (so the best trajectories can be fine-tuned on exactly as they were sampled), or on
rows made from chat transcripts with :func:`chat_row` (a warm start on synthetic solutions), and it
shares batching and log-probabilities with the GRPO update. What it does not know: where rows come
from, or when to stop.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from fulgor.adapters.trajectory import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo.config import COMPUTE_DTYPES
from fulgor.algorithms.grpo.update import (
    collate,
    compute_autocast,
    forward_prefixes,
    shares_prefixes,
    token_logprobs,
    waves,
)
from fulgor.errors import ConfigError

__all__ = ["SFTConfig", "SFTUpdater", "chat_row"]


@dataclass(frozen=True)
class SFTConfig:
    """How the fine-tuning step behaves. ``compute_dtype="bfloat16"`` runs the forward and backward
    under bfloat16 autocast (the weights, their gradients and the optimiser stay float32), as
    :class:`~fulgor.algorithms.grpo.GRPOConfig`'s does."""

    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    micro_batch_size: int = 16
    max_grad_norm: float = 1.0
    compute_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.micro_batch_size < 1:
            raise ConfigError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if not self.max_grad_norm > 0:
            raise ConfigError(
                f"max_grad_norm must be > 0 (pass a large value to leave gradients unclipped), "
                f"got {self.max_grad_norm}"
            )
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(
                f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {self.compute_dtype!r}"
            )


def chat_row(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    stop_token_ids: Collection[int] | None = None,
    turns: Collection[int] | None = None,
) -> TrajectoryRow:
    """A training row from a chat transcript, with the ids the engine serves it with.

    Each assistant turn is cut where the engine would see it: the conversation before it is rendered
    as the engine renders a prompt (:func:`fulgor.engine.prompts.render_chat_ids`, generation prompt
    included) and is context (mask 0); the turn's own tokens up to and including the end-of-turn
    token (what the model emits) get mask 1; what the template writes after that is context. A
    template that is not append-only (one that re-renders earlier turns) is refused, since its rows
    would not match what the engine sees when it serves the conversation turn by turn.

    A turn ends at the first of ``stop_token_ids``: pass the ids the engine stops on
    (:func:`fulgor.weights.loading.eos_token_ids` of the model and tokenizer, which adds the model's
    configs to the tokenizer's) when the model ends a turn with a token other than the tokenizer's
    ``eos_token_id``, the default.

    ``turns`` (indices into ``messages``) names the assistant turns to train; the others are context
    like every other message. By default every assistant turn is trained.
    """
    from fulgor.engine.prompts import render_chat_ids
    from fulgor.engine.protocol import ChatMessage, Tool

    parsed = [ChatMessage.model_validate(message) for message in messages]
    tool_defs = [Tool.model_validate(tool).model_dump(exclude_none=True) for tool in tools or ()] or None
    if stop_token_ids is not None:
        stops = frozenset(stop_token_ids)
    else:
        stops = frozenset() if tokenizer.eos_token_id is None else frozenset({tokenizer.eos_token_id})
    if not stops:
        raise ConfigError("no end-of-turn token: the tokenizer has no eos_token_id; pass stop_token_ids")
    token_ids: list[int] = []
    loss_mask: list[int] = []

    def extend(ids: list[int], trained_until: int = 0) -> None:
        if ids[: len(token_ids)] != token_ids:
            raise ConfigError(
                "the chat template re-renders earlier turns; chat_row needs an append-only template"
            )
        added = len(ids) - len(token_ids)
        loss_mask.extend(1 if offset < trained_until else 0 for offset in range(added))
        token_ids[:] = ids

    for index, message in enumerate(parsed):
        if message.role != "assistant" or (turns is not None and index not in turns):
            continue
        extend(render_chat_ids(tokenizer, parsed[:index], tool_defs, add_generation_prompt=True))
        turn_start = len(token_ids)
        full = render_chat_ids(tokenizer, parsed[: index + 1], tool_defs, add_generation_prompt=False)
        extend(full, trained_until=_end_of_turn(full, turn_start, stops) - turn_start)
    if not token_ids:
        raise ConfigError("the transcript has no assistant turn to train; there is nothing to train on")
    return TrajectoryRow(
        token_ids=token_ids,
        loss_mask=loss_mask,
        sampled_logprobs=[0.0] * len(token_ids),
        calls=[],
        returns=[0.0] * len(token_ids),
    )


def _end_of_turn(ids: list[int], start: int, stops: frozenset[int]) -> int:
    """The index just past the first end-of-turn token from ``start`` (the end when there is none)."""
    for position in range(start, len(ids)):
        if ids[position] in stops:
            return position + 1
    return len(ids)


class SFTUpdater:
    """Owns the optimiser; ``step`` (trajectories, the :class:`~fulgor.algorithms.base.Updater`
    protocol) and ``step_rows`` (rows) apply one fine-tuning update to ``model`` in place."""

    def __init__(self, model: Any, config: SFTConfig | None = None) -> None:
        import torch

        self.model = model
        self.config = config or SFTConfig()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )

    def state_dict(self) -> dict[str, Any]:
        """The optimiser's moments and step counts, for a resumed run."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of an updater over the same parameters)."""
        self.optimizer.load_state_dict(state["optimizer"])

    def step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One update on every row of ``trajectories`` (their rewards play no part: the rows were
        selected already)."""
        return self.step_rows([row for trajectory in trajectories for row in trajectory.rows])

    def step_rows(self, rows: Sequence[TrajectoryRow]) -> dict[str, float]:
        """One update: the mean negative log-likelihood over every trained token of ``rows``."""
        import torch

        if not rows:
            raise ConfigError("there are no rows to fine-tune on; pass at least one TrajectoryRow")
        device = next(self.model.parameters()).device
        batch = collate(
            [Trajectory(rollout_id="sft", group_id=None, reward=0.0, rows=list(rows), model_versions=[])]
        ).to(device)
        total = batch.loss_mask.sum()  # a row's first token is never trained (see collate)
        if not total:
            raise ConfigError(
                "no row has a token under loss mask 1 after its first position; nothing to fine-tune on"
            )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for wave in waves(batch, self.config.micro_batch_size, shares_prefixes(self.model, batch)):
            with compute_autocast(self.model, self.config.compute_dtype):
                prefixes = forward_prefixes(self.model, wave)  # tokens rows share run once per wave
            for part in wave.parts:
                with compute_autocast(self.model, self.config.compute_dtype):
                    logprobs, _ = token_logprobs(
                        self.model, part.input_ids, part.attention_mask, part.loss_mask, prefixes
                    )
                loss = -(logprobs * part.loss_mask).sum() / total
                loss.backward()  # type: ignore[no-untyped-call]
                loss_sum += float(loss.detach())
            if prefixes is not None:
                prefixes.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        return {"loss": loss_sum, "grad_norm": float(grad_norm), "trained_tokens": float(total)}
