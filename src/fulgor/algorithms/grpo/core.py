"""GRPO-family building blocks as pure functions on tensors, registered by name.

Advantages are computed once per rollout within its group and broadcast to the rollout's tokens
(a rollout split into several rows gets the same advantage on all of them). The policy loss is
normalised per rollout, so a rollout that the adapter had to split into several rows carries no
more weight than one that fit in a single row (Agent Lightning v1's ``per_rollout_mean``).

Shapes: ``R`` rollouts, ``B`` rows, ``T`` tokens per row (padded); ``rollout_index[b]`` says which
rollout row ``b`` belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fulgor.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "PolicyLossOutput",
    "advantage_estimator",
    "broadcast_to_tokens",
    "importance_weights",
    "kl_penalty",
    "policy_loss",
    "register_advantage",
]

AdvantageFn = Callable[["torch.Tensor", "torch.Tensor"], tuple["torch.Tensor", "torch.Tensor"]]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}
_EPSILON = 1e-6


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator ``(rewards[R], group_ids[R]) -> (advantages[R], has_signal[R])``."""

    def decorator(function: AdvantageFn) -> AdvantageFn:
        ADVANTAGE_ESTIMATORS[name] = function
        return function

    return decorator


def advantage_estimator(name: str) -> AdvantageFn:
    """The estimator registered as ``name``; a ConfigError lists the valid names."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ConfigError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None


def _group_stats(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per rollout: its group's mean reward, reward std (unbiased; 0 for a group of one) and size."""
    import torch

    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.shape, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, inverse, rewards
    )
    means = sums / counts
    squares = torch.zeros(counts.shape, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, inverse, (rewards - means[inverse]) ** 2
    )
    stds = torch.where(counts > 1, (squares / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(means))
    return means[inverse], stds[inverse], counts[inverse]


def _signal(stds: torch.Tensor) -> torch.Tensor:
    """A group whose rewards are all equal teaches nothing: its rollouts carry no gradient."""
    return stds > _EPSILON


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r - group mean) / group std.

    ``rewards[R]`` (float), ``group_ids[R]`` (int) -> ``advantages[R]``, ``has_signal[R]`` (bool).
    """
    means, stds, _ = _group_stats(rewards, group_ids)
    signal = _signal(stds)
    advantages = (rewards - means) / (stds + _EPSILON)
    return advantages * signal, signal


@register_advantage("grpo_mean")
def mean_only_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """r - group mean, no std scaling (Dr. GRPO). Shapes as ``grpo``."""
    means, stds, _ = _group_stats(rewards, group_ids)
    signal = _signal(stds)
    return (rewards - means) * signal, signal


@register_advantage("rloo")
def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """r - mean of the other rollouts in the group (leave-one-out). Shapes as ``grpo``."""
    means, stds, counts = _group_stats(rewards, group_ids)
    signal = _signal(stds) & (counts > 1)
    others = (means * counts - rewards) / (counts - 1).clamp(min=1)
    return (rewards - others) * signal, signal


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: r - group mean, then whitened across the whole batch."""
    means, stds, _ = _group_stats(rewards, group_ids)
    signal = _signal(stds)
    centred = (rewards - means) * signal
    if int(signal.sum()) < 2:
        return centred, signal
    active = centred[signal]
    return (centred - active.mean()) / (active.std() + _EPSILON) * signal, signal


def broadcast_to_tokens(
    per_rollout: torch.Tensor, rollout_index: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """``per_rollout[R]`` -> ``[B, T]``: each row's value on its sampled tokens, 0 elsewhere."""
    return per_rollout[rollout_index].unsqueeze(1) * loss_mask


@dataclass
class PolicyLossOutput:
    """The scalar loss and the statistics a training step reports."""

    loss: torch.Tensor
    clip_fraction: torch.Tensor
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor
    importance_weight_mean: torch.Tensor


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    rollout_index: torch.Tensor,
    n_rollouts: int,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    sampling_logprobs: torch.Tensor | None = None,
    importance_cap: float = 2.0,
    tokens_per_rollout: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """Clipped-ratio policy loss, normalised per rollout.

    ``logprobs[B, T]`` (current policy, with grad), ``old_logprobs[B, T]`` (the policy the ratio is
    taken against), ``advantages[B, T]`` (broadcast per rollout), ``loss_mask[B, T]`` (1 on sampled
    tokens), ``rollout_index[B]``. The clip range is ``[1 - clip_low, 1 + clip_high]``
    (asymmetric allowed). When ``sampling_logprobs[B, T]`` (what the engine recorded while
    sampling) is given, each token is weighted by the truncated importance ratio
    ``min(exp(old - sampling), importance_cap)``, which corrects for engine/trainer mismatch and for
    samples drawn by older weights. Each rollout's loss is the mean over its sampled tokens (all its
    rows together); the batch loss is the mean over the ``n_rollouts`` rollouts. When the rows are
    one micro-batch of a larger batch, pass the whole batch's ``tokens_per_rollout[R]``: the
    micro-batch losses then add up exactly to the whole batch's loss.
    """
    import torch

    mask = loss_mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    weight = torch.ones_like(ratio)
    if sampling_logprobs is not None:
        weight = importance_weights(old_logprobs, sampling_logprobs, importance_cap)
    per_token = per_token * weight * mask
    if tokens_per_rollout is None:
        tokens_per_rollout = torch.zeros(n_rollouts, dtype=mask.dtype, device=mask.device).index_add_(
            0, rollout_index, mask.sum(1)
        )
    loss_per_rollout = torch.zeros(n_rollouts, dtype=per_token.dtype, device=per_token.device).index_add_(
        0, rollout_index, per_token.sum(1)
    )
    loss = (loss_per_rollout / tokens_per_rollout.clamp(min=1.0)).sum() / max(n_rollouts, 1)
    count = mask.sum().clamp(min=1.0)
    with torch.no_grad():
        was_clipped = ((ratio - clipped).abs() > 1e-12).to(mask.dtype) * mask
        return PolicyLossOutput(
            loss=loss,
            clip_fraction=was_clipped.sum() / count,
            ratio_mean=(ratio * mask).sum() / count,
            ratio_max=(ratio * mask + (mask - 1) * 1e9).max() if mask.any() else ratio.new_tensor(1.0),
            importance_weight_mean=(weight * mask).sum() / count,
        )


def importance_weights(
    old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, importance_cap: float
) -> torch.Tensor:
    """``[B, T]``: the truncated importance ratio ``min(exp(old - sampling), importance_cap)``, detached."""
    import torch

    return torch.exp(old_logprobs - sampling_logprobs).clamp(max=importance_cap).detach()


def kl_penalty(
    logprobs: torch.Tensor, reference_logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Mean k3 estimate of KL(policy || reference) over sampled tokens: exp(d) - d - 1, d = ref - logp.

    ``logprobs[B, T]``, ``reference_logprobs[B, T]``, ``loss_mask[B, T]`` -> scalar (Schulman's k3:
    unbiased and always >= 0).
    """
    delta = reference_logprobs - logprobs
    per_token = (delta.exp() - delta - 1.0) * loss_mask
    return per_token.sum() / loss_mask.sum().clamp(min=1.0)
