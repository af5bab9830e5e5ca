"""The GRPO update on a small real transformers model."""

from __future__ import annotations

import copy

import pytest
import torch

from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.update import PolicyUpdater, collate, compute_advantages, token_logprobs
from fulgor.errors import ConfigError

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def row(prompt: list[int], response: list[int]) -> TrajectoryRow:
    return TrajectoryRow(
        token_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * len(response),
        sampled_logprobs=[0.0] * len(prompt) + [-1.0] * len(response),
        calls=[0],
        returns=[0.0] * (len(prompt) + len(response)),
    )


def trajectory(rollout_id: str, group: str, reward: float, rows: list[TrajectoryRow]) -> Trajectory:
    return Trajectory(rollout_id=rollout_id, group_id=group, reward=reward, rows=rows, model_versions=[])


BATCH = [
    trajectory("a", "g", 1.0, [row([1, 2, 3], [4, 5]), row([1, 2, 3, 4, 5, 6], [7])]),
    trajectory("b", "g", 0.0, [row([1, 2, 3], [8, 9, 10])]),
    trajectory("c", "h", 1.0, [row([5, 6], [7])]),
    trajectory("d", "h", 0.0, [row([5, 6], [9, 9])]),
]


def test_token_logprobs_match_a_plain_forward_pass_with_right_padding(model: torch.nn.Module) -> None:
    batch = collate(BATCH)
    logprobs, entropy = token_logprobs(model, batch.input_ids, batch.attention_mask)
    for b, ids in enumerate([r.token_ids for t in BATCH for r in t.rows]):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        expected = (
            torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
        )
        assert torch.allclose(logprobs[b, 1 : len(ids)], expected, atol=1e-5)
        assert (entropy[b, 1 : len(ids)] > 0).all()


def test_collate_masks_from_lengths_and_maps_rows_to_rollouts() -> None:
    batch = collate(BATCH, pad_id=4)  # a pad id that is also a real token must not matter
    assert batch.rollout_index.tolist() == [0, 0, 1, 2, 3]
    assert batch.attention_mask.sum(1).tolist() == [5, 7, 6, 3, 4]
    assert batch.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0]
    assert batch.n_rollouts == 4


def test_advantages_per_group_and_zero_variance_counted() -> None:
    advantages, no_signal = compute_advantages(
        [*BATCH, trajectory("e", "k", 1.0, [row([1], [2])])], "grpo_mean"
    )
    assert advantages.tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5, 0.0])
    assert no_signal == 1


def test_micro_batches_give_the_same_gradient_as_one_batch(model: torch.nn.Module) -> None:
    grads = []
    for micro in (1, 16):
        copy_ = copy.deepcopy(model)
        updater = PolicyUpdater(copy_, GRPOConfig(micro_batch_size=micro, importance_correction=False))
        metrics = updater.step(BATCH)
        grads.append(torch.cat([p.grad.flatten() for p in copy_.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert metrics["trained_tokens"] == 9.0
    assert metrics["rollouts_without_signal"] == 0.0
    assert metrics["entropy"] > 0


def test_updates_raise_the_logprob_of_rewarded_responses(model: torch.nn.Module) -> None:
    policy = copy.deepcopy(model)
    updater = PolicyUpdater(policy, GRPOConfig(learning_rate=1e-2, importance_correction=False))
    batch = collate(BATCH)

    def response_logprob(b: int) -> float:
        with torch.no_grad():
            logprobs, _ = token_logprobs(policy, batch.input_ids, batch.attention_mask)
        return float((logprobs[b] * batch.loss_mask[b]).sum())

    rewarded, unrewarded = response_logprob(0), response_logprob(2)
    for _ in range(5):
        updater.step(BATCH)
    assert response_logprob(0) > rewarded
    assert response_logprob(2) < unrewarded


def test_config_is_validated_early() -> None:
    with pytest.raises(ConfigError, match="rloo"):
        GRPOConfig(advantage="ppo")
    with pytest.raises(ConfigError, match="learning_rate"):
        GRPOConfig(learning_rate=0)
