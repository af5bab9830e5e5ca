"""GRPO-family functions against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from fulgor.algorithms.grpo.core import (
    ADVANTAGE_ESTIMATORS,
    advantage_estimator,
    broadcast_to_tokens,
    kl_penalty,
    policy_loss,
)
from fulgor.errors import ConfigError

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])
GROUPS = torch.tensor([0, 0, 1, 1])


def test_grpo_normalises_by_group_std_and_zero_variance_groups_carry_nothing() -> None:
    advantages, signal = advantage_estimator("grpo")(REWARDS, GROUPS)
    # group 0: mean 0.5, unbiased std sqrt(0.5) = 0.70711 -> +-0.5/0.70711; group 1 has no variance
    assert advantages.tolist() == pytest.approx([0.70710, -0.70710, 0.0, 0.0], abs=1e-4)
    assert signal.tolist() == [True, True, False, False]


def test_mean_only_and_rloo() -> None:
    advantages, _ = advantage_estimator("grpo_mean")(REWARDS, GROUPS)
    assert advantages.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    # one group of three: leave-one-out baselines 0, 0.5, 0.5
    advantages, signal = advantage_estimator("rloo")(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([7, 7, 7]))
    assert advantages.tolist() == pytest.approx([1.0, -0.5, -0.5])
    assert signal.all()


def test_reinforce_pp_whitens_across_the_batch() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    advantages, _ = advantage_estimator("reinforce_pp")(rewards, GROUPS)
    # centred [0.5, -0.5, -0.5, 0.5]; batch std (unbiased) = sqrt(1/3) = 0.57735 -> +-0.86603
    assert advantages.tolist() == pytest.approx([0.86603, -0.86603, -0.86603, 0.86603], abs=1e-4)


def test_unknown_estimator_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError, match="grpo_mean") as raised:
        advantage_estimator("ppo")
    for name in ADVANTAGE_ESTIMATORS:
        assert name in raised.value.message


def test_loss_is_normalised_per_rollout_not_per_token() -> None:
    # rollout 0 was split into two rows of 2 sampled tokens; rollout 1 has one row with 1 token.
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    rollout_index = torch.tensor([0, 0, 1])
    advantages = broadcast_to_tokens(torch.tensor([1.0, -2.0]), rollout_index, mask)
    assert advantages.tolist() == [[1.0, 1.0], [1.0, 1.0], [-2.0, 0.0]]
    logprobs = torch.zeros(3, 2, requires_grad=True)
    out = policy_loss(logprobs, torch.zeros(3, 2), advantages, mask, rollout_index, n_rollouts=2)
    # ratio 1: rollout 0 -> mean(-1) = -1; rollout 1 -> 2; batch -> (-1 + 2) / 2 = 0.5
    # (a mean over tokens would give -0.4)
    assert out.loss.item() == pytest.approx(0.5)
    out.loss.backward()
    assert logprobs.grad is not None
    # d loss / d logp = -A / tokens_in_rollout / n_rollouts
    expected = torch.tensor([[-0.125, -0.125], [-0.125, -0.125], [1.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected)
    assert out.clip_fraction.item() == 0.0


def test_asymmetric_clipping() -> None:
    mask = torch.ones(2, 1)
    rollout_index = torch.tensor([0, 1])
    advantages = torch.tensor([[1.0], [-1.0]])
    logprobs = torch.full((2, 1), math.log(1.5))
    out = policy_loss(
        logprobs, torch.zeros(2, 1), advantages, mask, rollout_index, 2, clip_low=0.1, clip_high=0.2
    )
    # A=+1: -min(1.5, 1.2) = -1.2 ; A=-1: -min(-1.5, -1.2) = 1.5 -> mean 0.15
    assert out.loss.item() == pytest.approx(0.15)
    assert out.clip_fraction.item() == 1.0
    assert out.ratio_mean.item() == pytest.approx(1.5)
    assert out.ratio_max.item() == pytest.approx(1.5)


def test_clip_low_bounds_a_ratio_below_one() -> None:
    # Ratio 0.5, clip range [0.9, 1.2]. A=-1: -min(-0.5, -0.9) = 0.9 (clipped up to 1 - clip_low);
    # A=+1: -min(0.5, 0.9) = -0.5 (the unclipped ratio is the pessimistic one).
    for advantage, expected in ((-1.0, 0.9), (1.0, -0.5)):
        out = policy_loss(
            torch.full((1, 1), math.log(0.5)),
            torch.zeros(1, 1),
            torch.full((1, 1), advantage),
            torch.ones(1, 1),
            torch.tensor([0]),
            1,
            clip_low=0.1,
            clip_high=0.2,
        )
        assert out.loss.item() == pytest.approx(expected)
        assert out.ratio_mean.item() == pytest.approx(0.5)


def test_truncated_importance_weights_from_recorded_sampling_logprobs() -> None:
    mask = torch.ones(1, 2)
    advantages = torch.ones(1, 2)
    old = torch.zeros(1, 2)
    sampling = torch.tensor(
        [[-math.log(3.0), -math.log(1.5)]]
    )  # weights exp(old - sampling) = 3 -> cap 2, 1.5
    out = policy_loss(
        torch.zeros(1, 2),
        old,
        advantages,
        mask,
        torch.tensor([0]),
        1,
        sampling_logprobs=sampling,
        importance_cap=2.0,
    )
    assert out.loss.item() == pytest.approx(-(2.0 + 1.5) / 2)
    assert out.importance_weight_mean.item() == pytest.approx(1.75)


def test_kl_penalty_k3() -> None:
    logprobs = torch.log(torch.tensor([[0.5, 0.5]]))
    reference = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.tensor([[1.0, 0.0]])
    # d = log 0.25 - log 0.5 = -log 2: exp(d) - d - 1 = 0.5 + 0.69315 - 1 = 0.19315; masked token ignored
    assert kl_penalty(logprobs, reference, mask).item() == pytest.approx(0.19315, abs=1e-5)
    assert kl_penalty(logprobs, logprobs, torch.ones(1, 2)).item() == 0.0
