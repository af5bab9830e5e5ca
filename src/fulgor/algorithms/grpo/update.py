"""The GRPO policy update on torch: trajectories in, one optimiser step (with micro-batches) out.

It reads top to bottom as the step does: ``collate`` trajectories into padded tensors,
``compute_advantages`` once per rollout within its group, then for each micro-batch compute the
policy's token logprobs, the loss of :mod:`fulgor.algorithms.grpo.core`, and accumulate gradients;
finally clip the gradient norm and step the optimiser.

What it does not know: where trajectories come from (the adapter), how weights reach the engine,
or when to validate (the trainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fulgor.adapters.trajectory import Trajectory
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.core import advantage_estimator, kl_penalty, policy_loss

if TYPE_CHECKING:
    import torch

__all__ = ["Batch", "PolicyUpdater", "collate", "compute_advantages", "token_logprobs"]


@dataclass
class Batch:
    """Trajectory rows as padded tensors: ``[B, T]`` each, and ``rollout_index[B]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    rollout_index: torch.Tensor
    n_rollouts: int

    def to(self, device: Any) -> Batch:
        """The same batch on ``device`` (the model's)."""
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.loss_mask.to(device),
            self.sampling_logprobs.to(device),
            self.rollout_index.to(device),
            self.n_rollouts,
        )


def collate(trajectories: list[Trajectory], pad_id: int = 0) -> Batch:
    """Right-pad every row of every trajectory; masks come from lengths, never from token values."""
    import torch

    rows = [(index, row) for index, trajectory in enumerate(trajectories) for row in trajectory.rows]
    width = max(len(row.token_ids) for _, row in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    sampling = torch.zeros(shape, dtype=torch.float32)
    for b, (_, row) in enumerate(rows):
        n = len(row.token_ids)
        input_ids[b, :n] = torch.tensor(row.token_ids)
        attention[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(row.loss_mask, dtype=torch.float32)
        sampling[b, :n] = torch.tensor(row.sampled_logprobs, dtype=torch.float32)
    rollout_index = torch.tensor([index for index, _ in rows], dtype=torch.long)
    return Batch(input_ids, attention, loss_mask, sampling, rollout_index, len(trajectories))


def compute_advantages(trajectories: list[Trajectory], estimator: str) -> tuple[torch.Tensor, int]:
    """Per-rollout advantages ``[R]`` within each group, and how many rollouts carry no signal."""
    import torch

    groups: dict[str, int] = {}
    group_ids = torch.tensor(
        [groups.setdefault(t.group_id or t.rollout_id, len(groups)) for t in trajectories], dtype=torch.long
    )
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    advantages, signal = advantage_estimator(estimator)(rewards, group_ids)
    return advantages, int((~signal).sum())


def token_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` each: log p(token t | tokens < t) under ``model``, and the entropy of that
    next-token distribution; position 0 (no context) is 0 in both."""
    import torch

    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)
    zero = torch.zeros_like(picked[:, :1])
    return torch.cat([zero, picked], dim=1), torch.cat([zero, entropy], dim=1)


class PolicyUpdater:
    """Owns the optimiser; ``step`` applies one GRPO update to ``model`` in place; ``state_dict`` and
    ``load_state_dict`` carry the optimiser through a checkpoint."""

    def __init__(self, model: Any, config: GRPOConfig, reference_model: Any | None = None) -> None:
        import torch

        self.model = model
        self.config = config
        self.reference_model = reference_model
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)

    def state_dict(self) -> dict[str, Any]:
        """What continuing exactly needs besides the weights: the optimiser's moments and step counts,
        and torch's random state (dropout, when a model or adapter has any, draws from it)."""
        import torch

        return {"optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of an updater over the same parameters)."""
        import torch

        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update from a batch of trajectories; returns the step's metrics."""
        import torch

        device = next(self.model.parameters()).device
        advantages, no_signal = compute_advantages(trajectories, self.config.advantage)
        advantages = advantages.to(device)
        batch = collate(trajectories).to(device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens_per_rollout = torch.zeros(batch.n_rollouts, device=device).index_add_(
            0, batch.rollout_index, batch.loss_mask.sum(1)
        )
        total_tokens = float(batch.loss_mask.sum())
        sums: dict[str, float] = {}
        for start in range(0, batch.input_ids.shape[0], self.config.micro_batch_size):
            part = slice(start, start + self.config.micro_batch_size)
            for key, value in self._accumulate(
                batch, advantages, part, tokens_per_rollout, total_tokens
            ).items():
                sums[key] = sums.get(key, 0.0) + value
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        return {
            **sums,
            "grad_norm": float(grad_norm),
            "rollouts_without_signal": float(no_signal),
            "trained_tokens": total_tokens,
            "reward_mean": float(sum(t.reward for t in trajectories) / len(trajectories)),
        }

    def _accumulate(
        self,
        batch: Batch,
        advantages: torch.Tensor,
        part: slice,
        tokens_per_rollout: torch.Tensor,
        total_tokens: float,
    ) -> dict[str, float]:
        """Forward and backward one micro-batch; returns its share of each batch metric."""
        import torch

        from fulgor.algorithms.grpo.core import broadcast_to_tokens

        mask = batch.loss_mask[part]
        index = batch.rollout_index[part]
        share = float(mask.sum()) / max(total_tokens, 1.0)  # this micro-batch's share of sampled tokens
        logprobs, entropy = token_logprobs(self.model, batch.input_ids[part], batch.attention_mask[part])
        output = policy_loss(
            logprobs,
            logprobs.detach(),  # one update per batch: the ratio is taken against this very policy
            broadcast_to_tokens(advantages, index, mask),
            mask,
            index,
            batch.n_rollouts,
            clip_low=self.config.clip_low,
            clip_high=self.config.clip_high,
            sampling_logprobs=batch.sampling_logprobs[part] if self.config.importance_correction else None,
            importance_cap=self.config.importance_cap,
            tokens_per_rollout=tokens_per_rollout,
        )
        loss = output.loss
        metrics = {
            "policy_loss": float(output.loss.detach()),
            "clip_fraction": float(output.clip_fraction) * share,
            "importance_weight_mean": float(output.importance_weight_mean) * share,
            "entropy": float((entropy * mask).sum() / mask.sum().clamp(min=1)) * share,
        }
        if self.reference_model is not None and self.config.kl_coef > 0:
            with torch.no_grad():
                reference, _ = token_logprobs(
                    self.reference_model, batch.input_ids[part], batch.attention_mask[part]
                )
            kl = kl_penalty(logprobs, reference, mask)
            loss = loss + self.config.kl_coef * kl * share
            metrics["kl"] = float(kl) * share
        loss.backward()  # type: ignore[no-untyped-call]
        return metrics
