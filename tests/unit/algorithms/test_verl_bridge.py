"""The verl bridge: verl's own estimators and losses (verl 0.9.1, its pure functions on CPU) on
fulgor's trajectories, checked against fulgor's functions on the same inputs."""

from __future__ import annotations

import copy
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.core import broadcast_to_tokens, policy_loss
from fulgor.algorithms.grpo.update import PolicyUpdater, collate, compute_advantages, token_logprobs
from fulgor.algorithms.verl import (
    VerlPolicyLoss,
    advantage_names,
    policy_loss_names,
    to_data_proto,
    token_advantages,
)
from fulgor.errors import ConfigError

pytest.importorskip(
    "verl", reason="the verl bridge needs verl: pip install --no-deps -r requirements-verl.txt"
)
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def row(prompt: list[int], response: list[int], mask: list[int] | None = None) -> TrajectoryRow:
    """``prompt + response``, the response under loss mask 1 (or ``mask`` over the response)."""
    trained = mask if mask is not None else [1] * len(response)
    full = [0] * len(prompt) + trained
    return TrajectoryRow(
        token_ids=prompt + response,
        loss_mask=full,
        sampled_logprobs=[-0.5 * m for m in full],
        calls=[0],
        returns=[0.0] * len(full),
    )


def trajectory(rollout_id: str, group: str, reward: float, rows: list[TrajectoryRow]) -> Trajectory:
    return Trajectory(rollout_id=rollout_id, group_id=group, reward=reward, rows=rows, model_versions=[])


def random_batch(seed: int, groups: int = 4, size: int = 5) -> list[Trajectory]:
    """``groups`` groups of ``size`` rollouts, rewards in {0, 0.5, 1} (one group all equal), some
    rollouts of two rows, responses with context tokens (mask 0) inside."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for g in range(groups):
        for i in range(size):
            reward = 0.5 if g == 0 else float(torch.randint(0, 3, (1,), generator=generator)) / 2
            prompt = torch.randint(1, 40, (2 + i,), generator=generator).tolist()
            response = torch.randint(1, 40, (3 + g,), generator=generator).tolist()
            rows = [row(prompt, response, [1, 0, *[1] * (len(response) - 2)])]
            if i % 2:
                rows.append(row(prompt + response, [7, 8]))
            found.append(trajectory(f"r{g}-{i}", f"g{g}", reward, rows))
    return found


def per_rollout(trajectories: list[Trajectory], per_token: list[list[torch.Tensor]]) -> torch.Tensor:
    """The one value each rollout's sampled tokens all carry (they must all carry the same)."""
    values = []
    for t, rows in zip(trajectories, per_token, strict=True):
        taken = torch.cat(
            [r[torch.tensor(x.loss_mask, dtype=torch.bool)] for x, r in zip(t.rows, rows, strict=True)]
        )
        assert torch.allclose(taken, taken[0].expand_as(taken)), "a rollout's tokens got different advantages"
        values.append(float(taken[0]))
    return torch.tensor(values)


def test_rows_become_verl_samples_laid_out_as_its_agent_loop_lays_them_out() -> None:
    batch = [
        trajectory("a", "g", 1.0, [row([1, 2, 3], [4, 5]), row([1, 2, 3, 4, 5, 6], [7, 9, 8], [1, 0, 1])]),
        trajectory("b", "g", 0.0, [row([2], [8, 9, 10, 11])]),
    ]
    data = to_data_proto(batch, pad_token_id=99)
    assert len(data) == 3
    assert data.batch["prompts"].tolist() == [[99, 99, 99, 1, 2, 3], [1, 2, 3, 4, 5, 6], [99] * 5 + [2]]
    assert data.batch["responses"].tolist() == [[4, 5, 99, 99], [7, 9, 8, 99], [8, 9, 10, 11]]
    assert data.batch["response_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]]
    assert data.batch["input_ids"].tolist()[0] == [99, 99, 99, 1, 2, 3, 4, 5, 99, 99]
    assert data.batch["attention_mask"].tolist()[0] == [0, 0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert data.batch["position_ids"].tolist()[0] == [0, 0, 0, 0, 1, 2, 3, 4, 4, 4]
    assert data.batch["rollout_log_probs"].tolist()[1] == [-0.5, 0.0, -0.5, 0.0]
    # The reward sits on each sample's last response token, as verl's reward manager puts it.
    assert data.batch["token_level_rewards"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert torch.equal(data.batch["rm_scores"], data.batch["token_level_scores"])
    assert list(data.non_tensor_batch["uid"]) == ["g", "g", "g"]
    assert list(data.non_tensor_batch["rollout_id"]) == ["a", "a", "b"]


def test_a_row_whose_first_token_is_sampled_keeps_it_in_the_prompt() -> None:
    data = to_data_proto([trajectory("a", "g", 1.0, [row([], [4, 5, 6])])])
    assert data.batch["prompts"].tolist() == [[4]]
    assert data.batch["responses"].tolist() == [[5, 6]]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("verl_name", "fulgor_name"),
    [
        ("verl:grpo", "grpo"),
        ("verl:grpo_vectorized", "grpo"),
        ("verl:rloo", "rloo"),
        ("verl:rloo_vectorized", "rloo"),
    ],
)
def test_verl_estimators_equal_fulgors_on_the_same_rollouts(
    seed: int, verl_name: str, fulgor_name: str
) -> None:
    batch = random_batch(seed)
    ours, _ = compute_advantages(batch, fulgor_name)
    theirs = per_rollout(batch, token_advantages(batch, verl_name))
    assert torch.allclose(theirs, ours, atol=1e-5), (theirs, ours)
    assert ours.abs().sum() > 0  # the groups carry signal: the comparison is not of zeros


def test_advantages_are_zero_outside_the_sampled_tokens() -> None:
    batch = random_batch(3)
    for t, rows in zip(batch, token_advantages(batch, "verl:grpo"), strict=True):
        for x, values in zip(t.rows, rows, strict=True):
            assert values.shape == (len(x.token_ids),)
            assert not values[torch.tensor(x.loss_mask) == 0].any()


def test_a_group_of_one_is_where_verl_and_fulgor_differ() -> None:
    # fulgor: a lone rollout teaches nothing; verl's grpo compares it with mean 0 and std 1.
    batch = [trajectory("a", "alone", 1.0, [row([1], [2, 3])])]
    ours, _ = compute_advantages(batch, "grpo")
    theirs = per_rollout(batch, token_advantages(batch, "verl:grpo"))
    assert float(ours[0]) == 0.0
    assert float(theirs[0]) == pytest.approx(1.0, abs=1e-5)


def test_every_estimator_fulgor_can_feed_runs() -> None:
    names = advantage_names()
    # verl 0.9.1's registry, less gae, remax, gdpo and the two optimal-token baselines (they need a
    # critic, a greedy baseline, reward components or the actor's statistics).
    assert [name.removeprefix("verl:") for name in names] == [
        "gpg", "grpo", "grpo_passk", "grpo_vectorized", "opo", "reinforce_plus_plus",
        "reinforce_plus_plus_baseline", "rloo", "rloo_vectorized",
    ]  # fmt: skip
    batch = random_batch(4)
    for name in names:
        per_token = token_advantages(batch, name)
        assert [len(rows) for rows in per_token] == [len(t.rows) for t in batch]
        assert all(torch.isfinite(values).all() for rows in per_token for values in rows), name


def test_unknown_names_list_verls_registries() -> None:
    with pytest.raises(ConfigError, match=r"verl has no advantage estimator 'verl:nope'.*'verl:grpo'"):
        GRPOConfig(advantage="verl:nope")
    with pytest.raises(ConfigError, match=r"verl has no policy loss 'verl:nope'.*'verl:vanilla'"):
        GRPOConfig(policy_loss="verl:nope")
    with pytest.raises(ConfigError, match=r"'verl:gae' needs \['values'.*do not carry; choose one of"):
        GRPOConfig(advantage="verl:gae")
    with pytest.raises(ConfigError, match="unknown policy loss 'clip'; choose 'ppo_clip'"):
        GRPOConfig(policy_loss="clip")
    with pytest.raises(ConfigError, match=r"'verl:dro' needs policy_loss\.dro_beta"):
        GRPOConfig(policy_loss="verl:dro")
    for name in ["verl:remax", "verl:optimal_token_baseline", "verl:gdpo"]:
        with pytest.raises(ConfigError, match="which fulgor's rollouts do not carry"):
            GRPOConfig(advantage=name)


def test_every_policy_loss_listed_runs_and_has_a_gradient() -> None:
    names = policy_loss_names()
    assert len(names) == 11  # verl 0.9.1's 12, less dro
    current, old = logprob_pair(0, (4, 6))
    mask = torch.ones((4, 6))
    mask[:, 0] = 0
    advantages = torch.randn((4, 6), generator=torch.Generator().manual_seed(1)) * mask
    for name in names:
        loss = VerlPolicyLoss(name, clip_low=0.2, clip_high=0.2, micro_batch_size=4)
        loss.start_batch(4, float(mask.sum()))
        value, _ = loss(current, old, advantages, mask)
        (gradient,) = torch.autograd.grad(value, current)
        assert torch.isfinite(gradient).all(), name
        assert gradient.abs().sum() > 0, name
        assert not gradient[:, 0].any(), name  # nothing outside the mask


def logprob_pair(seed: int, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Current and old logprobs whose ratios lie in [0.5, 2] (both sides of the clip range; under
    verl's dual clip at 3)."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=generator) * 3
    current = old + (torch.rand(shape, generator=generator) * 1.38 - 0.69)
    return current.requires_grad_(), old


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("importance", [False, True])
def test_verls_vanilla_loss_equals_fulgors_loss_and_gradient(seed: int, importance: bool) -> None:
    rows, width = 6, 9
    current, old = logprob_pair(seed, (rows, width))
    generator = torch.Generator().manual_seed(seed + 10)
    mask = (torch.rand((rows, width), generator=generator) > 0.3).float()
    mask[:, 0] = 0
    advantages = broadcast_to_tokens(torch.randn(rows, generator=generator), torch.arange(rows), mask)
    sampling = old + torch.randn((rows, width), generator=generator) * 0.3
    ours = policy_loss(
        current, old, advantages, mask, torch.arange(rows), rows, clip_low=0.2, clip_high=0.28,
        sampling_logprobs=sampling if importance else None, importance_cap=2.0,
    )  # fmt: skip
    (ours_grad,) = torch.autograd.grad(ours.loss, current)
    loss = VerlPolicyLoss("verl:vanilla", clip_low=0.2, clip_high=0.28, micro_batch_size=4)
    loss.start_batch(rows, float(mask.sum()))
    weights = torch.exp(old - sampling).clamp(max=2.0) if importance else None
    theirs, clip_fraction = loss(current, old, advantages, mask, weights)
    (theirs_grad,) = torch.autograd.grad(theirs, current)
    assert float(theirs.detach()) == pytest.approx(float(ours.loss.detach()), abs=1e-6)
    assert torch.allclose(theirs_grad, ours_grad, atol=1e-7)
    assert 0 < clip_fraction < 1  # some ratios were clipped: the clip range is the same one


SHAPE = {
    "vocab_size": 40, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
}  # fmt: skip


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE)).eval()


def params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_a_step_with_verls_grpo_and_vanilla_loss_is_fulgors_step(model: torch.nn.Module) -> None:
    # One row per rollout: verl's seq-mean-token-mean is then fulgor's per-rollout normalisation.
    batch = [t for t in random_batch(5, groups=3, size=4) if len(t.rows) == 1]
    steps = {}
    for advantage, loss in [("grpo", "ppo_clip"), ("verl:grpo", "ppo_clip"), ("verl:grpo", "verl:vanilla")]:
        policy = copy.deepcopy(model)
        config = GRPOConfig(learning_rate=1e-2, advantage=advantage, policy_loss=loss, micro_batch_size=2)
        metrics = PolicyUpdater(policy, config).step(batch)
        steps[advantage, loss] = (params(policy), metrics)
    reference, reference_metrics = steps["grpo", "ppo_clip"]
    assert not torch.equal(reference, params(model))
    for key, (weights, metrics) in steps.items():
        assert torch.allclose(weights, reference, atol=1e-6), key
        assert metrics["policy_loss"] == pytest.approx(reference_metrics["policy_loss"], abs=1e-6)
        assert metrics["rollouts_without_signal"] == reference_metrics["rollouts_without_signal"]


def test_verls_grpo_trains_the_model_toward_rewarded_responses(model: torch.nn.Module) -> None:
    batch = [
        trajectory("a", "g", 1.0, [row([1, 2, 3], [4, 5]), row([1, 2, 3, 4, 5, 6], [7])]),
        trajectory("b", "g", 0.0, [row([1, 2, 3], [8, 9, 10])]),
        trajectory("c", "h", 1.0, [row([5, 6], [7])]),
        trajectory("d", "h", 0.0, [row([5, 6], [9, 9])]),
    ]
    policy = copy.deepcopy(model)
    config = GRPOConfig(learning_rate=1e-2, advantage="verl:grpo", policy_loss="verl:vanilla")
    updater = PolicyUpdater(policy, config)
    rows = collate(batch)

    def response_logprob(b: int) -> float:
        with torch.no_grad():
            logprobs, _ = token_logprobs(policy, rows.input_ids, rows.attention_mask)
        return float((logprobs[b] * rows.loss_mask[b]).sum())

    rewarded, unrewarded = response_logprob(0), response_logprob(2)
    for _ in range(5):
        metrics = updater.step(batch)
        assert metrics["optimizer_steps"] == 1.0
    assert response_logprob(0) > rewarded
    assert response_logprob(2) < unrewarded


def test_a_batch_without_signal_under_verls_estimator_leaves_the_weights_alone(
    model: torch.nn.Module,
) -> None:
    batch = [trajectory(name, "g", 0.5, [row([1, 2], [3, 4])]) for name in "ab"]
    policy = copy.deepcopy(model)
    metrics = PolicyUpdater(policy, GRPOConfig(advantage="verl:grpo")).step(batch)
    assert metrics["optimizer_steps"] == 0.0
    assert metrics["rollouts_without_signal"] == 2.0
    assert torch.equal(params(policy), params(model))


def test_importing_verl_leaves_the_root_logger_alone() -> None:
    # verl's __init__ calls logging.basicConfig; the bridge must not let that reach the application.
    code = (
        "import logging; from fulgor.algorithms.verl import advantage_names; advantage_names(); "
        "import verl; root = logging.getLogger(); print(len(root.handlers), root.level)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["0", str(logging.WARNING)]


def test_this_repositorys_tests_package_is_not_shadowed_by_verls() -> None:
    # verl 0.9.1's wheel ships a top-level `tests` package; the Makefile removes it after installing.
    import tests

    assert {Path(path).resolve() for path in tests.__path__} == {Path(__file__).resolve().parents[2]}


def test_without_verl_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo", None)
    with pytest.raises(ImportError, match=r"pip install --no-deps verl==0\.9\.1 tensordict==0\.10\.0"):
        GRPOConfig(advantage="verl:grpo")
