"""GRPO hyperparameters, next to the algorithm (one place, typed, validated early)."""

from __future__ import annotations

from dataclasses import dataclass

from fulgor.errors import ConfigError

__all__ = ["COMPUTE_DTYPES", "GRPOConfig"]

COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class GRPOConfig:
    """How the GRPO update behaves.

    ``advantage`` names an estimator in ``fulgor.algorithms.grpo.core.ADVANTAGE_ESTIMATORS``
    (grpo, grpo_mean, rloo, reinforce_pp), or one verl registers as ``"verl:NAME"`` (``"verl:grpo"``;
    see :mod:`fulgor.algorithms.verl`). ``policy_loss`` is fulgor's clipped loss normalised per
    rollout (``"ppo_clip"``), or one verl registers as ``"verl:NAME"`` (``"verl:vanilla"``, with
    verl's ``seq-mean-token-mean`` over rows). ``mini_batches`` splits each batch (whole groups
    together) into that many optimiser steps. ``clip_low``/``clip_high`` bound the ratio of the
    policy being updated to the policy the batch's update started from, to
    ``[1 - clip_low, 1 + clip_high]``: it is 1 in the first step of a batch, so with one step per
    batch (the default) the clip has no effect and the update is a policy gradient with
    group-relative advantages; from the second mini-batch on it is PPO's clipped objective.
    ``importance_correction`` weights tokens by the truncated ratio of that starting policy to the
    engine's logprobs (capped at ``importance_cap``): it corrects for engine/trainer mismatch and
    for samples drawn by older weights. ``kl_coef`` > 0 needs a reference model. The logprobs
    are taken in training mode: a model with dropout gives them dropout's noise (LLM RL runs with
    dropout off, as fulgor's built models do).

    ``gradient_checkpointing`` keeps only each decoder layer's inputs through the forward and
    recomputes the rest in the backward (transformers' ``gradient_checkpointing_enable``): less
    memory for activations, one more forward of compute; it also turns shared prefixes off.
    ``compute_dtype="bfloat16"`` runs the forward and backward under bfloat16 autocast (the
    weights, their gradients and the optimiser stay float32; logprobs are taken in float32).
    """

    learning_rate: float = 3e-5
    weight_decay: float = 0.0
    advantage: str = "grpo"
    policy_loss: str = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    importance_correction: bool = True
    importance_cap: float = 2.0
    micro_batch_size: int = 16
    max_grad_norm: float = 1.0
    mini_batches: int = 1
    gradient_checkpointing: bool = False
    compute_dtype: str = "float32"

    def __post_init__(self) -> None:
        from fulgor.algorithms.grpo.core import advantage_estimator
        from fulgor.algorithms.verl import bridge

        # Each lookup raises a ConfigError that lists the valid names.
        if bridge.is_verl(self.advantage):
            bridge.check_advantage(self.advantage)
        else:
            advantage_estimator(self.advantage)
        if bridge.is_verl(self.policy_loss):
            bridge.check_policy_loss(self.policy_loss)
        elif self.policy_loss != "ppo_clip":
            raise ConfigError(
                f"unknown policy loss {self.policy_loss!r}; choose 'ppo_clip' (fulgor's) or one of verl's "
                "as 'verl:NAME' ('verl:vanilla')"
            )
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ConfigError(
                f"clip_low must be in [0, 1) and clip_high >= 0, got {self.clip_low}, {self.clip_high}"
            )
        if self.micro_batch_size < 1:
            raise ConfigError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.mini_batches < 1:
            raise ConfigError(f"mini_batches must be >= 1, got {self.mini_batches}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(
                f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {self.compute_dtype!r}"
            )
        if self.importance_cap < 1:
            raise ConfigError(f"importance_cap must be >= 1, got {self.importance_cap}")
        if not self.kl_coef >= 0:
            raise ConfigError(f"kl_coef must be >= 0 (0 turns the KL term off), got {self.kl_coef}")
        if not self.max_grad_norm > 0:
            raise ConfigError(
                f"max_grad_norm must be > 0 (pass a large value to leave gradients unclipped), "
                f"got {self.max_grad_norm}"
            )
