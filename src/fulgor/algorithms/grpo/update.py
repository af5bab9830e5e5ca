"""The GRPO policy update on torch: trajectories in, optimiser steps (with micro-batches) out.

It reads top to bottom as the step does: ``collate`` trajectories into padded tensors,
``compute_advantages`` once per rollout within its group, then for each of the micro-batches (in
``waves``) compute the policy's token logprobs, the loss of :mod:`fulgor.algorithms.grpo.core`, and
accumulate gradients; finally clip the gradient norm and step the optimiser. With
``GRPOConfig.mini_batches`` > 1 the batch is split (whole groups together) into that many such
steps, each later one taking its ratio against the logprobs the policy had before the first.

Three things keep the step from computing what the loss never reads, or computing it twice:
micro-batches hold rows of similar length, each cut to its own longest row; tokens that rows begin
with alike (a GRPO group's prompt, an agent's system prompt and tools) run through the decoder once
per wave of micro-batches, forward and backward (``forward_prefixes``, see
:mod:`fulgor.algorithms.grpo.prefix`), and each row's micro-batch then runs on what follows; and
``token_logprobs`` runs the LM head and the softmax only where the loss mask is 1 (the head over a
vocabulary at every prompt and padding position is a large share of a small model's work). None
changes the loss or its gradient beyond float rounding: the loss is normalised per rollout over the
whole batch, whatever rows share a micro-batch.

With ``GRPOConfig(advantage="verl:NAME")`` the advantages come per token from verl's estimator
(:mod:`fulgor.algorithms.verl`) instead of per rollout, and with ``policy_loss="verl:NAME"`` verl's
loss takes the place of :func:`~fulgor.algorithms.grpo.core.policy_loss`; the rest of the step is
the same.

Data parallel (:class:`RowShare`): each of N processes runs every step on its own share of the rows,
with the whole batch's normalisation, so the rows' gradients summed over the processes are the one
process's gradient; the processes' model (sharded with FSDP2, see
:mod:`fulgor.training.distributed`) sums them.

What it does not know: where trajectories come from (the adapter), how weights reach the engine,
or when to validate (the trainer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from fulgor.adapters.trajectory import Trajectory
from fulgor.algorithms.grpo import prefix
from fulgor.algorithms.grpo.config import GRPOConfig
from fulgor.algorithms.grpo.core import advantage_estimator, importance_weights, kl_penalty, policy_loss
from fulgor.algorithms.verl import bridge as verl_bridge
from fulgor.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "Batch",
    "PolicyUpdater",
    "RowShare",
    "Wave",
    "collate",
    "compute_advantages",
    "forward_prefixes",
    "micro_batches",
    "shares_prefixes",
    "token_logprobs",
    "waves",
]

# Causal LMs whose forward is exactly ``lm_head(model(...).last_hidden_state)`` (transformers 5:
# no logit scaling or soft-capping), so the head may run on chosen positions only. Exact class
# names: a subclass may override ``forward``.
_PLAIN_HEAD_MODELS = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
)


@dataclass
class Batch:
    """Trajectory rows as padded tensors: ``[B, T]`` each, and ``rollout_index[B]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    rollout_index: torch.Tensor
    n_rollouts: int
    old_logprobs: torch.Tensor | None = None
    """The policy's logprobs before this batch's update began; None: the policy being updated is
    still that policy (the first optimiser step), so its own logprobs stand in."""
    advantages: torch.Tensor | None = None
    """``[B, T]`` advantages per token, when the estimator gives them so (verl's); None: each
    rollout's advantage is broadcast to its tokens."""

    def to(self, device: Any) -> Batch:
        """The same batch on ``device`` (the model's)."""
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.loss_mask.to(device),
            self.sampling_logprobs.to(device),
            self.rollout_index.to(device),
            self.n_rollouts,
            None if self.old_logprobs is None else self.old_logprobs.to(device),
            None if self.advantages is None else self.advantages.to(device),
        )

    def rows(self, index: torch.Tensor, width: int) -> Batch:
        """Rows ``index`` (in that order), cut to their first ``width`` tokens."""
        return Batch(
            self.input_ids[index, :width],
            self.attention_mask[index, :width],
            self.loss_mask[index, :width],
            self.sampling_logprobs[index, :width],
            self.rollout_index[index],
            self.n_rollouts,
            None if self.old_logprobs is None else self.old_logprobs[index, :width],
            None if self.advantages is None else self.advantages[index, :width],
        )


def collate(
    trajectories: list[Trajectory],
    pad_id: int = 0,
    token_advantages: list[list[torch.Tensor]] | None = None,
) -> Batch:
    """Right-pad every row of every trajectory; masks come from lengths, never from token values.

    A token at position 0 gets loss mask 0 whatever its row says: nothing precedes it, so no
    logprob of it can be computed (:func:`token_logprobs`) and it could only dilute the loss.
    ``token_advantages`` (per trajectory, per row, ``[len(row)]``) become the batch's ``advantages``.
    """
    import torch

    rows = [(index, row) for index, trajectory in enumerate(trajectories) for row in trajectory.rows]
    if not rows:
        raise ConfigError("there are no trajectory rows to collate; pass at least one trajectory with a row")
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
    loss_mask[:, 0] = 0
    rollout_index = torch.tensor([index for index, _ in rows], dtype=torch.long)
    batch = Batch(input_ids, attention, loss_mask, sampling, rollout_index, len(trajectories))
    if token_advantages is not None:
        batch.advantages = torch.zeros(shape, dtype=torch.float32)
        for b, values in enumerate(row for per_row in token_advantages for row in per_row):
            batch.advantages[b, : len(values)] = values
    return batch


def micro_batches(batch: Batch, size: int) -> Iterator[Batch]:
    """``batch`` in micro-batches of up to ``size`` rows, longest rows first, each cut to its own
    longest row, so rows of similar length share one and little of the work goes to padding.

    Rows are right-padded, so cutting the padding leaves every kept position's result unchanged.
    """
    lengths = batch.attention_mask.sum(1).tolist()
    order = sorted(range(len(lengths)), key=lambda b: -lengths[b])  # stable: ties keep batch order
    for start in range(0, len(order), size):
        yield _part(batch, order[start : start + size], lengths)


def _part(batch: Batch, rows: list[int], lengths: list[int]) -> Batch:
    import torch

    index = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    return batch.rows(index, int(max(lengths[b] for b in rows)))


@dataclass
class Wave:
    """Micro-batches ``parts`` whose rows read one forward over the prefixes they share
    (:func:`forward_prefixes`): ``rows`` are their token ids, numbered as ``plan`` numbers them;
    without a plan they share nothing."""

    parts: list[Batch]
    rows: list[list[int]]
    plan: prefix.Plan | None


def waves(batch: Batch, size: int, share_prefixes: bool = False) -> list[Wave]:
    """``batch`` in micro-batches of up to ``size`` rows, each cut to its own longest row: with
    ``share_prefixes`` (see :func:`shares_prefixes`) in the waves of
    :func:`fulgor.algorithms.grpo.prefix.schedule` when they compute fewer token positions, otherwise
    in one wave of :func:`micro_batches`. A shared prefix ends before the first position whose hidden
    state the loss reads (the one that predicts the first token under loss mask 1)."""
    import torch

    if not share_prefixes:
        return [Wave(list(micro_batches(batch, size)), [], None)]
    read = (batch.loss_mask[:, 1:] > 0) & (batch.attention_mask[:, 1:] > 0)
    lengths = batch.attention_mask.sum(1)
    limits = torch.where(read.any(1), read.int().argmax(1), lengths - 1).tolist()
    lengths_list = lengths.tolist()
    rows = [ids[:n] for ids, n in zip(batch.input_ids.tolist(), lengths_list, strict=True)]
    return [
        Wave(
            [_part(batch, part, lengths_list) for part in wave.parts], [rows[b] for b in wave.rows], wave.plan
        )
        for wave in prefix.schedule(rows, limits, size)
    ]


@dataclass(frozen=True)
class RowShare:
    """Process ``rank`` of ``world_size`` in a data-parallel update (``torch.distributed`` initialised):
    each batch's rows, longest first, are dealt out in turn, so every process gets rows of every
    length and the first process at most one more row than the others."""

    rank: int
    world_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank must be in [0, world_size), got {self.rank} of {self.world_size}")

    def parts(self, batch: Batch, size: int) -> list[Batch]:
        """This process's rows of ``batch`` in micro-batches of up to ``size`` rows (as
        :func:`micro_batches` cuts them), then idle ones (one row, nothing trained) up to the count
        the first process has: a sharded model needs every process to run as many forwards and
        backwards as the others."""
        lengths = batch.attention_mask.sum(1).tolist()
        order = sorted(range(len(lengths)), key=lambda b: -lengths[b])
        mine = order[self.rank :: self.world_size]
        count = -(-len(order[0 :: self.world_size]) // size)
        parts = [_part(batch, mine[start : start + size], lengths) for start in range(0, len(mine), size)]
        return parts + [_idle(batch)] * (count - len(parts))

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """``values`` summed over the processes (the same keys on each)."""
        import torch
        import torch.distributed as dist

        keys = sorted(values)
        total = torch.tensor([values[key] for key in keys], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            total = total.cuda()
        dist.all_reduce(total)
        return dict(zip(keys, total.tolist(), strict=True))


def _idle(batch: Batch) -> Batch:
    """The first row of ``batch`` with no token under the loss: a forward and backward that add
    nothing to any gradient."""
    import torch

    part = batch.rows(torch.zeros(1, dtype=torch.long, device=batch.input_ids.device), 2)
    return replace(part, loss_mask=torch.zeros_like(part.loss_mask))


def _mini_batches(trajectories: list[Trajectory], count: int) -> list[list[int]]:
    """Indices of ``trajectories`` in up to ``count`` mini-batches of whole groups, in order, as
    even in groups as can be."""
    groups: dict[str, list[int]] = {}
    for index, trajectory in enumerate(trajectories):
        groups.setdefault(trajectory.group_id or trajectory.rollout_id, []).append(index)
    members = list(groups.values())
    count = min(count, len(members))
    bounds = [round(i * len(members) / count) for i in range(count + 1)]
    return [[i for group in members[a:b] for i in group] for a, b in pairwise(bounds)]


def shares_prefixes(model: Any, batch: Batch) -> bool:
    """Whether ``model``, in its present mode (training or not), can read prefixes that rows of
    ``batch`` share from one forward over them (:func:`forward_prefixes`)."""
    split = _decoder_and_head(model)
    # A prefix and what follows it in another row are each at most a row long.
    return split is not None and prefix.supports(split[0], 2 * batch.input_ids.shape[1])


def forward_prefixes(model: Any, wave: Wave) -> prefix.SharedPrefixes | None:
    """One forward of ``model``'s decoder over the prefixes that ``wave``'s rows share, for
    :func:`token_logprobs` to read in each of its micro-batches; with gradients on, call its
    ``backward()`` after their backwards. None when the rows share none or ``model`` cannot read
    shared prefixes."""
    split = _decoder_and_head(model)
    if wave.plan is None or split is None:
        return None
    if not prefix.supports(split[0], 2 * max(len(row) for row in wave.rows)):
        return None
    return prefix.SharedPrefixes(split[0], wave.rows, wave.plan)


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


def compute_autocast(model: Any, compute_dtype: str) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast on ``model``'s device with ``compute_dtype="bfloat16"``, else nothing: the
    weights, their gradients and the optimiser stay float32 (on a CPU with AMX or AVX512-BF16 the
    matrix products run about twice as fast)."""
    import torch

    if compute_dtype != "bfloat16":
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    prefixes: prefix.SharedPrefixes | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` each: log p(token t | tokens < t) under ``model``, and the entropy of that
    next-token distribution; position 0 (no context) and padding are 0 in both.

    With ``loss_mask[B, T]`` only the positions where it is 1 are computed, the rest are 0: for a
    Llama, Mistral or Qwen2/3 causal LM (also under a peft LoRA adapter) the LM head and the softmax
    run on those positions only; any other model gives its full logits, of which only those positions
    go through the softmax.

    With ``prefixes`` (from :func:`forward_prefixes` over the same model and rows that include
    these) each row reads the prefix it shares from them and the decoder runs on the rest only.
    """
    import torch

    real = attention_mask[:, 1:] > 0
    chosen = real if loss_mask is None else real & (loss_mask[:, 1:] > 0)
    positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions}
    split = _decoder_and_head(model)
    if prefixes is not None and (split is None or prefixes.decoder is not split[0]):
        raise ValueError("prefixes were computed by another model's decoder")
    if split is None:
        logits = model(**inputs, use_cache=False).logits[:, :-1][chosen]
    else:
        decoder, head = split
        if prefixes is not None:
            hidden = prefixes.hidden_states(input_ids, attention_mask, chosen)
        else:
            hidden = decoder(**inputs, use_cache=False).last_hidden_state[:, :-1][chosen]
        logits = head(hidden)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:][chosen].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)
    return _spread(picked, chosen), _spread(entropy, chosen)


def _spread(values: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """``values[N]`` at the ``N`` true positions of ``chosen[B, T - 1]`` -> ``[B, T]`` (shifted one to
    the right: position 0 predicts nothing), 0 elsewhere."""
    import torch

    spread = torch.zeros(chosen.shape, dtype=values.dtype, device=values.device).masked_scatter(
        chosen, values
    )
    return torch.nn.functional.pad(spread, (1, 0))


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The decoder and the LM head of a model whose logits are just the head over the decoder's last
    hidden state; None when the structure is unknown (the caller then takes the full logits)."""
    base = _unwrap_lora(model)
    if type(base).__name__ not in _PLAIN_HEAD_MODELS:
        return None
    return base.model, base.lm_head


def _unwrap_lora(model: Any) -> Any:
    """The model under a plain peft LoRA adapter (its layers carry the adapter, so calling them runs
    it); ``model`` itself when it is not a peft model; None under any other peft wrapper."""
    try:
        from peft import PeftModel
    except ImportError:
        return model
    if not isinstance(model, PeftModel):
        return model
    config = model.active_peft_config
    # Prompt learning and activated LoRA (aLoRA) change the inputs in the wrapper's forward, which
    # calling the decoder directly would skip.
    if config.peft_type != "LORA" or getattr(config, "alora_invocation_tokens", None):
        return None
    return model.get_base_model()


class PolicyUpdater:
    """Owns the optimiser; ``step`` applies one GRPO update to ``model`` in place; ``state_dict`` and
    ``load_state_dict`` carry the optimiser through a checkpoint.

    With ``share`` this process is one of a data-parallel update: ``step`` (called with the same
    trajectories in every process) trains this process's rows only, and ``model`` must sum the
    processes' gradients (FSDP2 averages them; the loss is scaled by the process count to make the
    average a sum). Its metrics are the whole batch's.
    """

    def __init__(
        self,
        model: Any,
        config: GRPOConfig,
        reference_model: Any | None = None,
        share: RowShare | None = None,
    ) -> None:
        import torch

        self.model = model
        self.config = config
        self.reference_model = reference_model
        self.share = share
        if config.gradient_checkpointing:
            _checkpoint_gradients(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.verl_loss: verl_bridge.VerlPolicyLoss | None = None
        if verl_bridge.is_verl(config.policy_loss):
            self.verl_loss = verl_bridge.VerlPolicyLoss(
                config.policy_loss,
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                micro_batch_size=config.micro_batch_size,
            )

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
        """One update from a batch of trajectories (``config.mini_batches`` optimiser steps, whole
        groups together); returns the step's metrics, averaged over its optimiser steps
        (``optimizer_steps`` counts the steps taken: see :meth:`_optimise`)."""
        import torch

        if not trajectories:
            raise ConfigError("a policy update needs at least one trajectory; skip the update without one")
        device = next(self.model.parameters()).device
        per_token = None
        if verl_bridge.is_verl(self.config.advantage):
            per_token = verl_bridge.token_advantages(trajectories, self.config.advantage)
            no_signal = sum(not any(bool(row.any()) for row in rows) for rows in per_token)
            advantages = torch.zeros(len(trajectories), device=device)  # per token instead
        else:
            advantages, no_signal = compute_advantages(trajectories, self.config.advantage)
            advantages = advantages.to(device)
        self.model.train()
        # A rollout without rows here (another adapter's agents made its calls) still counts in its
        # group's advantages; a mini-batch of such rollouts alone has nothing to train.
        parts = [
            part
            for part in _mini_batches(trajectories, self.config.mini_batches)
            if any(trajectories[i].rows for i in part)
        ]
        if not parts:
            raise ConfigError(
                "a policy update needs at least one trajectory row; skip the update without one"
            )
        batches = [
            collate(
                [trajectories[i] for i in part],
                token_advantages=None if per_token is None else [per_token[i] for i in part],
            ).to(device)
            for part in parts
        ]
        for batch in batches[1:]:
            # Later steps take their ratio against the policy as it was before the first one.
            batch.old_logprobs = self._logprobs(batch)
        steps = [
            self._optimise(batch, advantages[torch.tensor(part, device=device)])
            for part, batch in zip(parts, batches, strict=True)
        ]
        metrics = {key: sum(step[key] for step in steps) / len(steps) for key in steps[0]}
        taken = [step["grad_norm"] for step in steps if step["optimizer_steps"]]
        return {
            **metrics,
            "grad_norm": sum(taken) / len(taken) if taken else 0.0,  # of the steps taken only
            "trained_tokens": sum(step["trained_tokens"] for step in steps),
            "optimizer_steps": sum(step["optimizer_steps"] for step in steps),
            "rollouts_without_signal": float(no_signal),
            "reward_mean": float(sum(t.reward for t in trajectories) / len(trajectories)),
        }

    def _optimise(self, batch: Batch, advantages: torch.Tensor) -> dict[str, float]:
        """One optimiser step over ``batch`` (its rollouts' ``advantages[R]``); returns its metrics.

        When every advantage is 0 and no KL term is on, the gradient is 0 and the step is skipped
        (``optimizer_steps`` 0): AdamW would still move the weights along its momentum and by
        weight decay, on a batch that teaches nothing.
        """
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        tokens_per_rollout = torch.zeros(batch.n_rollouts, device=advantages.device).index_add_(
            0, batch.rollout_index, batch.loss_mask.sum(1)
        )
        total_tokens = float(batch.loss_mask.sum())
        if self.verl_loss is not None:
            self.verl_loss.start_batch(int((batch.loss_mask.sum(1) > 0).sum()), total_tokens)
        sums: dict[str, float] = {}
        for wave in self._waves(batch):
            with self._autocast():
                prefixes = forward_prefixes(self.model, wave)
                reference = self._reference_prefixes(wave)
            for part in wave.parts:
                metrics = self._accumulate(
                    part, advantages, tokens_per_rollout, total_tokens, prefixes, reference
                )
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
            if prefixes is not None:
                prefixes.backward()
        if self.share is not None:
            sums = self.share.sum(sums)
        signal = batch.advantages if batch.advantages is not None else advantages
        if not self._kl_on() and not bool(signal.any()):
            return {**sums, "grad_norm": 0.0, "trained_tokens": total_tokens, "optimizer_steps": 0.0}
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # a sharded model's norm is a DTensor
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        return {**sums, "grad_norm": float(grad_norm), "trained_tokens": total_tokens, "optimizer_steps": 1.0}

    def _verl_policy_loss(
        self,
        verl_loss: verl_bridge.VerlPolicyLoss,
        logprobs: torch.Tensor,
        old: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        sampling: torch.Tensor | None,
        share: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """verl's policy loss on one micro-batch (its tokens ``share`` of the batch's) and its metrics."""
        weights = None if sampling is None else importance_weights(old, sampling, self.config.importance_cap)
        loss, clip_fraction = verl_loss(logprobs, old, advantages, mask, weights)
        count = mask.sum().clamp(min=1.0)
        weight_mean = 1.0 if weights is None else float((weights * mask).sum() / count)
        return loss, {
            "policy_loss": float(loss.detach()),
            "clip_fraction": clip_fraction * share,
            "importance_weight_mean": weight_mean * share,
        }

    def _waves(self, batch: Batch) -> list[Wave]:
        """The micro-batches this process runs: all of ``batch``'s (sharing prefixes where the model
        can), or with ``share`` its own rows' (a sharded model cannot run its decoder apart)."""
        if self.share is not None:
            return [Wave(self.share.parts(batch, self.config.micro_batch_size), [], None)]
        share = shares_prefixes(self.model, batch)
        return waves(batch, self.config.micro_batch_size, share)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return compute_autocast(self.model, self.config.compute_dtype)

    def _kl_on(self) -> bool:
        return self.reference_model is not None and self.config.kl_coef > 0

    def _logprobs(self, batch: Batch) -> torch.Tensor:
        """``[B, T]``: the policy's present logprobs of ``batch``'s sampled tokens, without gradients."""
        import torch

        size = self.config.micro_batch_size
        lengths = batch.attention_mask.sum(1).tolist()
        logprobs = torch.zeros_like(batch.sampling_logprobs)
        with torch.no_grad(), self._autocast():
            for start in range(0, len(lengths), size):
                end = min(start + size, len(lengths))
                width = int(max(lengths[start:end]))
                index = torch.arange(start, end, device=batch.input_ids.device)
                part = batch.rows(index, width)
                values, _ = token_logprobs(self.model, part.input_ids, part.attention_mask, part.loss_mask)
                logprobs[start:end, :width] = values
        return logprobs

    def _reference_prefixes(self, wave: Wave) -> prefix.SharedPrefixes | None:
        """The reference model's forward over ``wave``'s shared prefixes, when the KL term needs it."""
        import torch

        if not self._kl_on():
            return None
        with torch.no_grad():
            return forward_prefixes(self.reference_model, wave)

    def _accumulate(
        self,
        part: Batch,
        advantages: torch.Tensor,
        tokens_per_rollout: torch.Tensor,
        total_tokens: float,
        prefixes: prefix.SharedPrefixes | None,
        reference_prefixes: prefix.SharedPrefixes | None,
    ) -> dict[str, float]:
        """Forward and backward one micro-batch (reading the shared prefixes of its wave); returns its
        share of each batch metric."""
        import torch

        from fulgor.algorithms.grpo.core import broadcast_to_tokens

        mask = part.loss_mask
        share = float(mask.sum()) / max(total_tokens, 1.0)  # this micro-batch's share of sampled tokens
        with self._autocast():
            logprobs, entropy = token_logprobs(
                self.model, part.input_ids, part.attention_mask, mask, prefixes
            )
        old = part.old_logprobs if part.old_logprobs is not None else logprobs.detach()
        if part.advantages is not None:
            token_advantages = part.advantages * mask
        else:
            token_advantages = broadcast_to_tokens(advantages, part.rollout_index, mask)
        sampling = part.sampling_logprobs if self.config.importance_correction else None
        if self.verl_loss is not None:
            loss, metrics = self._verl_policy_loss(
                self.verl_loss, logprobs, old, token_advantages, mask, sampling, share
            )
        else:
            output = policy_loss(
                logprobs,
                old,
                token_advantages,
                mask,
                part.rollout_index,
                part.n_rollouts,
                clip_low=self.config.clip_low,
                clip_high=self.config.clip_high,
                sampling_logprobs=sampling,
                importance_cap=self.config.importance_cap,
                tokens_per_rollout=tokens_per_rollout,
            )
            loss = output.loss
            metrics = {
                "policy_loss": float(output.loss.detach()),
                "clip_fraction": float(output.clip_fraction) * share,
                "importance_weight_mean": float(output.importance_weight_mean) * share,
            }
        metrics["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1)) * share
        if self._kl_on():
            with torch.no_grad(), self._autocast():
                reference, _ = token_logprobs(
                    self.reference_model, part.input_ids, part.attention_mask, mask, reference_prefixes
                )
            kl = kl_penalty(logprobs, reference, mask)
            loss = loss + self.config.kl_coef * kl * share
            metrics["kl"] = float(kl.detach()) * share
        if self.share is not None:
            loss = loss * self.share.world_size  # the processes' gradients are averaged: make it a sum
        loss.backward()  # type: ignore[no-untyped-call]
        return metrics


def _checkpoint_gradients(model: Any) -> None:
    """Turn on transformers' activation (gradient) checkpointing, non-reentrant (it works with frozen
    inputs and under FSDP); a ConfigError when ``model`` has none."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ConfigError(
            f"{type(model).__name__} has no activation_checkpointing_enable(); train it with "
            "gradient_checkpointing=False"
        )
