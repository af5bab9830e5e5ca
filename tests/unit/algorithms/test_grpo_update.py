"""The GRPO update on a small real transformers model."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.core import broadcast_to_tokens, policy_loss
from fulgor.algorithms.grpo.update import (
    Batch,
    PolicyUpdater,
    collate,
    compute_advantages,
    forward_prefixes,
    micro_batches,
    shares_prefixes,
    token_logprobs,
    waves,
)
from fulgor.errors import ConfigError

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE = {
    "vocab_size": 40, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
}  # fmt: skip


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE)).eval()


class Wrapped(torch.nn.Module):
    """A model whose structure ``token_logprobs`` does not know: it must take the full logits."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **inputs: Any) -> Any:
        return self.inner(**inputs)


def qwen2() -> torch.nn.Module:
    torch.manual_seed(1)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE)).eval()


def lora(model: torch.nn.Module) -> torch.nn.Module:
    """A LoRA adapter that already changes the output (B is not 0), on the LM head too."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(2)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False)
    return peft.get_peft_model(copy.deepcopy(model), config)


def full_path(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the model's own logits at every position, log-softmax, the next token's value
    and the entropy (detached)."""
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
    every = torch.log_softmax(logits[:, :-1].float(), -1)
    picked = every.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(every.exp() * every).sum(-1).detach()
    return torch.nn.functional.pad(picked, (1, 0)), torch.nn.functional.pad(entropy, (1, 0))


def grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def head_rows(model: Any) -> list[int]:
    """Rows (batch x positions) each later forward feeds the LM head."""
    seen: list[int] = []
    head = getattr(model, "inner", model).get_output_embeddings()
    head.register_forward_hook(
        lambda _m, args, _out: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
    )
    return seen


def row(prompt: list[int], response: list[int], trained: list[int] | None = None) -> TrajectoryRow:
    """``prompt + response``, the response under loss mask 1 (or the given mask over the whole row)."""
    mask = trained if trained is not None else [0] * len(prompt) + [1] * len(response)
    return TrajectoryRow(
        token_ids=prompt + response,
        loss_mask=mask,
        sampled_logprobs=[-1.0 * m for m in mask],
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


PROMPT_G = [(3 * i) % 37 + 1 for i in range(20)]
PROMPT_H = [(7 * i) % 39 + 1 for i in range(24)]
# Groups whose rows begin with the same prompt (g: 20 tokens, h: 24), rows of different lengths, a
# rollout of two rows, and a row that shares nothing with the others (e).
SHARED = [
    trajectory("a", "g", 1.0, [row(PROMPT_G, [4, 5]), row([*PROMPT_G, 4, 5, 6], [7, 8])]),
    trajectory("b", "g", 0.0, [row(PROMPT_G, [8, 9, 10])]),
    trajectory("c", "h", 1.0, [row(PROMPT_H, [7])]),
    trajectory("d", "h", 0.0, [row(PROMPT_H, [9, 9, 3])]),
    trajectory("e", "h", 0.5, [row([5, 6], [7, 3])]),
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


@pytest.mark.parametrize(
    "make", [lambda m: m, lambda _m: qwen2(), lora, Wrapped], ids=["llama", "qwen2", "lora", "unknown"]
)
def test_logprobs_under_the_loss_mask_and_their_gradients_equal_the_full_path(
    model: torch.nn.Module, make: Any
) -> None:
    batch = collate(BATCH)
    mask = batch.loss_mask
    first = make(copy.deepcopy(model))
    second = copy.deepcopy(first)
    seen = head_rows(first)
    logprobs, entropy = token_logprobs(first, batch.input_ids, batch.attention_mask, mask)
    expected, expected_entropy = full_path(second, batch.input_ids, batch.attention_mask)
    known = not isinstance(first, Wrapped)
    assert seen == [int(mask[:, 1:].sum()) if known else mask.numel()]  # the head ran where it had to
    assert torch.allclose(logprobs, expected * mask, atol=1e-5)
    assert torch.allclose(entropy, expected_entropy * mask, atol=1e-5)
    weights = torch.linspace(0.5, 2.0, mask.numel()).reshape(mask.shape) * mask
    (logprobs * weights).sum().backward()
    (expected * weights).sum().backward()
    assert torch.allclose(grads(first), grads(second), atol=1e-5)


def test_micro_batches_sort_rows_by_length_and_cut_each_to_its_longest_row() -> None:
    batch = collate(BATCH)
    parts = list(micro_batches(batch, 2))
    assert [part.rollout_index.tolist() for part in parts] == [[0, 1], [0, 3], [2]]  # lengths 7 6 | 5 4 | 3
    assert [part.input_ids.shape for part in parts] == [(2, 7), (2, 5), (1, 3)]
    assert parts[1].loss_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 1, 0]]
    assert all(part.n_rollouts == 4 for part in parts)


def reference_step(
    model: torch.nn.Module, trajectories: list[Trajectory] = BATCH
) -> tuple[torch.Tensor, dict[str, float]]:
    """The gradient and metrics of one update computed the plain way: the whole batch padded to its
    longest row in one forward, full logits at every position."""
    batch = collate(trajectories)
    advantages, _ = compute_advantages(trajectories, GRPOConfig().advantage)
    logprobs, entropy = full_path(model, batch.input_ids, batch.attention_mask)
    mask = batch.loss_mask
    output = policy_loss(
        logprobs, logprobs.detach(), broadcast_to_tokens(advantages, batch.rollout_index, mask), mask,
        batch.rollout_index, batch.n_rollouts, sampling_logprobs=batch.sampling_logprobs,
    )  # fmt: skip
    output.loss.backward()
    return grads(model), {
        "policy_loss": float(output.loss.detach()),
        "entropy": float((entropy * mask).sum() / mask.sum()),
        "importance_weight_mean": float(output.importance_weight_mean),
        "clip_fraction": float(output.clip_fraction),
    }


def shares(trajectories: list[Trajectory], micro: int) -> bool:
    """Whether the update reads shared prefixes for this batch and micro-batch size."""
    return any(wave.plan is not None for wave in waves(collate(trajectories), micro, share_prefixes=True))


@pytest.mark.parametrize("trajectories", [BATCH, SHARED], ids=["plain", "shared-prefixes"])
def test_micro_batches_give_the_same_gradient_and_metrics_as_one_batch(
    model: torch.nn.Module, trajectories: list[Trajectory]
) -> None:
    expected_grads, expected = reference_step(copy.deepcopy(model).train(), trajectories)
    assert 0 < expected["importance_weight_mean"] < 1  # the correction is on and weighs tokens
    for micro in (1, 2, 3, 16):  # 2 and 3 split rollout "a"'s two rows across micro-batches
        assert shares(trajectories, micro) == (trajectories is SHARED)
        copy_ = copy.deepcopy(model)
        metrics = PolicyUpdater(copy_, GRPOConfig(micro_batch_size=micro)).step(trajectories)
        assert torch.allclose(grads(copy_), expected_grads, atol=1e-6), micro
        for key, value in expected.items():
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (micro, key)
        assert metrics["trained_tokens"] == float(collate(trajectories).loss_mask.sum())
        assert metrics["rollouts_without_signal"] == 0.0


@pytest.mark.parametrize("trajectories", [BATCH, SHARED], ids=["plain", "shared-prefixes"])
def test_the_kl_term_is_the_same_in_micro_batches(
    model: torch.nn.Module, trajectories: list[Trajectory]
) -> None:
    reference = qwen2()  # another policy, so that the KL is not 0
    runs = []
    for micro in (1, 3, 16):
        copy_ = copy.deepcopy(model)
        config = GRPOConfig(micro_batch_size=micro, kl_coef=0.5)
        metrics = PolicyUpdater(copy_, config, reference_model=reference).step(trajectories)
        runs.append((grads(copy_), metrics["kl"]))
    assert runs[0][1] > 0
    for gradient, kl in runs[1:]:
        assert torch.allclose(gradient, runs[0][0], atol=1e-6)
        assert kl == pytest.approx(runs[0][1], rel=1e-5)


def test_a_lora_model_trains_through_the_selected_positions(model: torch.nn.Module) -> None:
    wrapped = lora(model)
    expected_grads, expected = reference_step(copy.deepcopy(wrapped).train())
    seen = head_rows(wrapped)
    metrics = PolicyUpdater(wrapped, GRPOConfig(micro_batch_size=2)).step(BATCH)
    assert seen == [4, 4, 1]  # per micro-batch (rows of 7 and 6 tokens, 5 and 4, 3): its trained positions
    assert [name for name, p in wrapped.named_parameters() if p.grad is not None] == [
        name for name, p in wrapped.named_parameters() if "lora_" in name
    ]
    assert torch.allclose(grads(wrapped), expected_grads, atol=1e-6)
    assert metrics["policy_loss"] == pytest.approx(expected["policy_loss"], abs=1e-6)


def test_a_lora_model_reads_shared_prefixes_and_gets_the_one_batch_gradient(model: torch.nn.Module) -> None:
    wrapped = lora(model)
    expected_grads, expected = reference_step(copy.deepcopy(wrapped).train(), SHARED)
    assert shares_prefixes(wrapped.train(), collate(SHARED))
    metrics = PolicyUpdater(wrapped, GRPOConfig(micro_batch_size=2)).step(SHARED)
    assert [name for name, p in wrapped.named_parameters() if p.grad is not None] == [
        name for name, p in wrapped.named_parameters() if "lora_" in name
    ]
    assert torch.allclose(grads(wrapped), expected_grads, atol=1e-6)
    assert metrics["policy_loss"] == pytest.approx(expected["policy_loss"], abs=1e-6)


def weighed(part: Batch) -> torch.Tensor:
    """Per-token weights that depend on a row's tokens only, not on where the row sits."""
    return part.loss_mask * (1 + part.input_ids / 40)


def decoder_positions(model: Any) -> list[tuple[int, ...]]:
    """The shape of the ids each later decoder forward runs on."""
    seen: list[tuple[int, ...]] = []
    model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: seen.append(tuple(args[0].shape))
    )
    return seen


@pytest.mark.parametrize("make", [lambda m: m, lambda _m: qwen2(), lora], ids=["llama", "qwen2", "lora"])
def test_rows_reading_shared_prefixes_get_the_full_paths_logprobs_and_gradients(
    model: torch.nn.Module, make: Any
) -> None:
    first = make(copy.deepcopy(model)).train()
    second = copy.deepcopy(first)
    batch = collate(SHARED)
    assert shares_prefixes(first, batch)
    seen = decoder_positions(first)
    schedule = waves(batch, 2, share_prefixes=True)
    for wave in schedule:
        prefixes = forward_prefixes(first, wave)
        assert (prefixes is None) == (wave.plan is None)
        for part in wave.parts:
            logprobs, entropy = token_logprobs(
                first, part.input_ids, part.attention_mask, part.loss_mask, prefixes
            )
            with torch.no_grad():
                expected, expected_entropy = full_path(second, part.input_ids, part.attention_mask)
            assert torch.allclose(logprobs, expected * part.loss_mask, atol=1e-5)
            assert torch.allclose(entropy, expected_entropy * part.loss_mask, atol=1e-5)
            (logprobs * weighed(part)).sum().backward()
        if prefixes is not None:
            prefixes.backward()
    (full_path(second, batch.input_ids, batch.attention_mask)[0] * weighed(batch)).sum().backward()
    assert torch.allclose(grads(first), grads(second), atol=1e-5)
    # Both prompts ran once, in one forward (g's cut to 19 tokens: its rows' losses read position 19
    # on), then what follows them; fewer positions than the rows sorted by length.
    assert seen[0] == (2, 23)
    plain = sum(part.input_ids.numel() for part in micro_batches(batch, 2))
    assert sum(rows * width for rows, width in seen) < plain


def test_a_position_read_inside_a_shared_prefix_is_refused(model: torch.nn.Module) -> None:
    batch = collate(SHARED)
    wave = waves(batch, 16, share_prefixes=True)[0]
    prefixes = forward_prefixes(model, wave)
    part = wave.parts[0]
    with pytest.raises(ValueError, match="inside a shared prefix"):
        token_logprobs(model, part.input_ids, part.attention_mask, None, prefixes)  # every position


def test_rows_in_a_shared_prefix_train_exactly_where_turns_repeat(model: torch.nn.Module) -> None:
    """Rows whose common tokens include a trained turn: the prefix stops before it."""
    turn = [*PROMPT_G, 4, 5]
    trained = [0] * len(PROMPT_G) + [1, 1]
    rows = [row(turn, [], trained), row(turn, [6, 7], [*trained, 0, 1]), row(turn, [9], [*trained, 1])]
    trajectories = [trajectory(f"r{i}", "g", float(i), [r]) for i, r in enumerate(rows)]
    (wave,) = waves(collate(trajectories), 16, share_prefixes=True)
    assert wave.plan is not None
    assert wave.plan.prefix_lengths == [19]
    expected_grads, _ = reference_step(copy.deepcopy(model).train(), trajectories)
    copy_ = copy.deepcopy(model)
    PolicyUpdater(copy_, GRPOConfig(micro_batch_size=2)).step(trajectories)
    assert torch.allclose(grads(copy_), expected_grads, atol=1e-6)


def test_models_that_cannot_read_shared_prefixes_take_the_plain_path(model: torch.nn.Module) -> None:
    peft = pytest.importorskip("peft")
    batch = collate(SHARED)
    assert not shares_prefixes(Wrapped(model), batch)  # the structure is unknown
    checkpointed = copy.deepcopy(model).train()
    checkpointed.activation_checkpointing_enable()
    assert not shares_prefixes(checkpointed, batch)  # the cache would be dropped
    config = peft.LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.1)
    dropout = peft.get_peft_model(copy.deepcopy(model), config)
    assert not shares_prefixes(dropout.train(), batch)  # one dropout mask would serve many rows
    assert shares_prefixes(dropout.eval(), batch)
    assert forward_prefixes(model, waves(batch, 2)[0]) is None  # no plan without share_prefixes


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


def params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_mini_batches_step_per_group_and_take_the_ratio_against_the_starting_policy(
    model: torch.nn.Module,
) -> None:
    """Two mini-batches: group g, then group h, each an optimiser step; the second one's ratio is
    against the logprobs the policy had before the first step (PPO), so the clip acts."""
    config = GRPOConfig(learning_rate=0.05, mini_batches=2, importance_correction=False)
    policy = copy.deepcopy(model)
    metrics = PolicyUpdater(policy, config).step(BATCH)
    assert metrics["optimizer_steps"] == 2.0
    assert metrics["trained_tokens"] == float(collate(BATCH).loss_mask.sum())
    assert metrics["clip_fraction"] > 0  # the first step moved the policy past the clip range

    # The same two steps by hand: g alone, then h with the starting policy's logprobs as "old".
    by_hand = copy.deepcopy(model)
    group_h = [t for t in BATCH if t.group_id == "h"]
    h_batch = collate(group_h)
    by_hand.train()
    h_batch.old_logprobs = token_logprobs(by_hand, h_batch.input_ids, h_batch.attention_mask)[0].detach()
    updater = PolicyUpdater(by_hand, config)
    updater._optimise(
        collate([t for t in BATCH if t.group_id == "g"]), compute_advantages(BATCH[:2], "grpo")[0]
    )
    updater._optimise(h_batch, compute_advantages(group_h, "grpo")[0])
    assert torch.allclose(params(policy), params(by_hand), atol=1e-6)


def test_with_one_step_per_batch_the_clip_cannot_act(model: torch.nn.Module) -> None:
    """The ratio of the first step is exactly 1: clip settings change nothing (documented)."""
    results = []
    for clip in (0.0, 0.2, 10.0):
        policy = copy.deepcopy(model)
        config = GRPOConfig(learning_rate=0.05, clip_low=min(clip, 0.9), clip_high=clip)
        metrics = PolicyUpdater(policy, config).step(BATCH)
        assert metrics["clip_fraction"] == 0.0
        results.append(params(policy))
    assert all(torch.equal(results[0], other) for other in results[1:])
    two_steps = []
    for clip in (0.01, 10.0):
        policy = copy.deepcopy(model)
        config = GRPOConfig(
            learning_rate=0.05, clip_low=clip if clip < 1 else 0.9, clip_high=clip, mini_batches=2
        )
        PolicyUpdater(policy, config).step(BATCH)
        two_steps.append(params(policy))
    assert not torch.allclose(two_steps[0], two_steps[1])


def test_config_is_validated_early() -> None:
    with pytest.raises(ConfigError, match="rloo"):
        GRPOConfig(advantage="ppo")
    with pytest.raises(ConfigError, match="learning_rate"):
        GRPOConfig(learning_rate=0)
    with pytest.raises(ConfigError, match="mini_batches"):
        GRPOConfig(mini_batches=0)
    with pytest.raises(ConfigError, match="kl_coef"):
        GRPOConfig(kl_coef=-0.1)
    for norm in (0.0, -1.0):
        with pytest.raises(ConfigError, match="max_grad_norm"):
            GRPOConfig(max_grad_norm=norm)


def test_an_empty_batch_is_refused_with_a_clear_error(model: torch.nn.Module) -> None:
    with pytest.raises(ConfigError, match="at least one trajectory"):
        PolicyUpdater(copy.deepcopy(model), GRPOConfig()).step([])
    with pytest.raises(ConfigError, match="no trajectory rows"):
        collate([])


def test_a_token_at_position_0_is_never_under_the_loss_mask() -> None:
    """Nothing precedes it, so it has no logprob (``token_logprobs`` gives 0 there): trained, it would
    only dilute its rollout's loss and get a made-up importance weight."""
    no_prompt = trajectory("a", "g", 1.0, [row([], [5, 6, 7])])
    batch = collate([no_prompt, BATCH[1]])
    assert batch.loss_mask[0].tolist() == [0, 1, 1, 0, 0, 0]
    assert batch.loss_mask[1].tolist() == [0, 0, 0, 1, 1, 1]


def pair(rewards: tuple[float, float], group: str = "g") -> list[Trajectory]:
    """Two rollouts of one group, with these rewards."""
    return [trajectory(f"{group}{i}", group, r, [row([1, 2, 3], [4 + i, 5])]) for i, r in enumerate(rewards)]


def test_a_batch_without_signal_leaves_the_weights_alone(model: torch.nn.Module) -> None:
    """Equal rewards: the policy gradient is 0, and AdamW must not step on its momentum (or decay)."""
    policy = copy.deepcopy(model)
    updater = PolicyUpdater(policy, GRPOConfig(learning_rate=1e-2, weight_decay=0.1))
    before = params(policy)
    assert updater.step(pair((1.0, 0.0)))["optimizer_steps"] == 1.0
    moved = params(policy)
    assert not torch.equal(before, moved)
    metrics = updater.step(pair((1.0, 1.0)))
    assert torch.equal(params(policy), moved)
    assert metrics["optimizer_steps"] == 0.0
    assert metrics["grad_norm"] == 0.0


def test_with_mini_batches_only_those_with_signal_step(model: torch.nn.Module) -> None:
    policy = copy.deepcopy(model)
    config = GRPOConfig(learning_rate=1e-2, mini_batches=2)
    metrics = PolicyUpdater(policy, config).step([*pair((1.0, 0.0), "g"), *pair((1.0, 1.0), "h")])
    assert metrics["optimizer_steps"] == 1.0
    # The gradient norm is the step's that was taken, not diluted by the skipped one.
    alone = PolicyUpdater(copy.deepcopy(model), GRPOConfig(learning_rate=1e-2)).step(pair((1.0, 0.0), "g"))
    assert metrics["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-5)
    assert alone["grad_norm"] > 0


def test_with_the_kl_term_on_a_batch_without_signal_still_steps(model: torch.nn.Module) -> None:
    policy = copy.deepcopy(model)
    config = GRPOConfig(learning_rate=1e-2, kl_coef=0.1)
    updater = PolicyUpdater(policy, config, reference_model=copy.deepcopy(model))
    updater.step(pair((1.0, 0.0)))
    moved = params(policy)
    metrics = updater.step(pair((1.0, 1.0)))
    assert metrics["optimizer_steps"] == 1.0
    assert not torch.equal(params(policy), moved)
