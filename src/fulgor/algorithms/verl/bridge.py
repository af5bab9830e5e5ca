"""fulgor's trajectories as verl's ``DataProto``, and verl's registered advantage estimators and
policy losses run on them.

A name ``"verl:NAME"`` picks ``NAME`` from verl's own registries (``ADV_ESTIMATOR_REGISTRY`` and
``POLICY_LOSS_REGISTRY`` in ``verl.trainer.ppo.core_algos``), so every estimator and loss the
installed verl registers is available by its verl name. Only verl's pure functions run here; its
workers (Ray, FSDP, vLLM) need CUDA and are not used.

Layout, as verl's agent loop lays a sample out: ``prompts[N, P]`` left-padded, ``responses[N, L]``
right-padded, ``input_ids``/``attention_mask``/``position_ids`` ``[N, P + L]`` their concatenation,
``response_mask[N, L]`` 1 on sampled tokens (tool results and other context inside a response are
0), ``rollout_log_probs[N, L]`` the engine's logprobs of the sampled tokens,
``rm_scores``/``token_level_scores``/``token_level_rewards[N, L]`` the reward on the last response
token, and
``uid`` (the GRPO group) and ``rollout_id`` per sample. A row's response starts at its first sampled
token (never at position 0, which no logprob can be computed for).

What it does not know: stores (:mod:`fulgor.algorithms.verl.export` reads them) and the policy
update (:mod:`fulgor.algorithms.grpo.update` calls this module).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fulgor.adapters.trajectory import Trajectory, TrajectoryRow
from fulgor.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "PREFIX",
    "VerlPolicyLoss",
    "advantage_names",
    "check_advantage",
    "check_policy_loss",
    "compute_advantages",
    "is_verl",
    "policy_loss_names",
    "to_data_proto",
    "token_advantages",
]

PREFIX = "verl:"
INSTALL = (
    "the verl bridge needs verl 0.9.1 and the packages its pure functions import: `pip install --no-deps "
    "verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 omegaconf==2.4.0 codetiming==1.4.0 cloudpickle==3.1.3` "
    "(in a fulgor checkout, `pip install --no-deps -r requirements-verl.txt`; `make test` does it). "
    "--no-deps because verl's declared dependencies pin transformers<5.11 and pull ray[default], "
    "datasets and wandb, which these functions do not use"
)
# What fulgor's rollouts give an estimator: the arguments verl's trainer passes every estimator
# (``compute_advantage`` in verl/trainer/ppo/ray_trainer.py), less a critic's values, a greedy
# baseline's rewards and the actor's extra statistics, which fulgor's rollouts do not carry.
_GIVEN = frozenset({"token_level_rewards", "response_mask", "index", "config"})
# Estimators that need more than their signature says, and what.
_NEEDS = {"gdpo": ["each reward component as a value of its own (verl's algorithm.gdpo_reward_keys)"]}
# Losses that need a setting verl gives no default and fulgor does not set.
_LOSS_NEEDS = {"dro": "policy_loss.dro_beta, which has no default in verl"}


def is_verl(name: str) -> bool:
    """Whether ``name`` names one of verl's functions (``"verl:grpo"``)."""
    return name.startswith(PREFIX)


def _core_algos() -> Any:
    """verl's ``core_algos`` module (importing it imports ``verl``)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as error:
        raise ImportError(f"{INSTALL} ({error})") from error
    finally:
        # Importing verl calls logging.basicConfig; a library leaves the root logger to the application.
        root.handlers[:] = handlers
        root.setLevel(level)
    return core_algos


def advantage_names() -> list[str]:
    """Every estimator verl registers that fulgor's rollouts can feed, as ``verl:NAME``."""
    registry = _core_algos().ADV_ESTIMATOR_REGISTRY
    return [PREFIX + name for name in sorted(registry) if not _missing_inputs(name, registry[name])]


def policy_loss_names() -> list[str]:
    """Every policy loss verl registers that runs with fulgor's settings, as ``verl:NAME``."""
    return [PREFIX + name for name in sorted(_core_algos().POLICY_LOSS_REGISTRY) if name not in _LOSS_NEEDS]


def _missing_inputs(name: str, function: Any) -> list[str]:
    """The required inputs of a verl estimator that fulgor's rollouts cannot give."""
    return _NEEDS.get(name, []) + [
        parameter.name
        for parameter in inspect.signature(function).parameters.values()
        if parameter.default is parameter.empty
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        and parameter.name not in _GIVEN
    ]


def check_advantage(name: str) -> Any:
    """verl's estimator for ``name`` (``verl:NAME``); a ConfigError lists the usable names."""
    registry = _core_algos().ADV_ESTIMATOR_REGISTRY
    function = registry.get(name.removeprefix(PREFIX))
    if function is None:
        raise ConfigError(f"verl has no advantage estimator {name!r}; choose one of {advantage_names()}")
    missing = _missing_inputs(name.removeprefix(PREFIX), function)
    if missing:
        raise ConfigError(
            f"verl's estimator {name!r} needs {missing}, which fulgor's rollouts do not carry; "
            f"choose one of {advantage_names()}"
        )
    return function


def check_policy_loss(name: str) -> Any:
    """verl's policy loss for ``name`` (``verl:NAME``); a ConfigError lists the valid names."""
    function = _core_algos().POLICY_LOSS_REGISTRY.get(name.removeprefix(PREFIX))
    if function is None:
        raise ConfigError(f"verl has no policy loss {name!r}; choose one of {policy_loss_names()}")
    if name.removeprefix(PREFIX) in _LOSS_NEEDS:
        raise ConfigError(
            f"verl's policy loss {name!r} needs {_LOSS_NEEDS[name.removeprefix(PREFIX)]}; "
            f"choose one of {policy_loss_names()}"
        )
    return function


@dataclass
class _Sample:
    """One verl sample: its prompt and response token ids, and what goes with the response."""

    prompt: list[int]
    response: list[int]
    response_mask: list[int]
    logprobs: list[float]
    reward: float
    uid: str
    rollout_id: str


def _response_start(row: TrajectoryRow) -> int:
    """Where ``row``'s response begins: its first sampled token, never position 0."""
    first = next((i for i, mask in enumerate(row.loss_mask) if mask), len(row.token_ids))
    return max(first, 1) if row.token_ids else 0


def _row_sample(trajectory: Trajectory, row: TrajectoryRow) -> _Sample:
    start = _response_start(row)
    return _Sample(
        row.token_ids[:start],
        row.token_ids[start:],
        row.loss_mask[start:],
        row.sampled_logprobs[start:],
        trajectory.reward,
        trajectory.group_id or trajectory.rollout_id,
        trajectory.rollout_id,
    )


def _rollout_sample(trajectory: Trajectory) -> _Sample:
    """The rollout as one sample: its rows' responses joined (a prompt is not needed to estimate)."""
    parts = [_row_sample(trajectory, row) for row in trajectory.rows]
    return _Sample(
        [],
        [token for part in parts for token in part.response],
        [mask for part in parts for mask in part.response_mask],
        [logprob for part in parts for logprob in part.logprobs],
        trajectory.reward,
        trajectory.group_id or trajectory.rollout_id,
        trajectory.rollout_id,
    )


def _data_proto(samples: Sequence[_Sample], pad_token_id: int) -> Any:
    import numpy as np
    import torch

    _core_algos()  # the ImportError that says how to install verl, and the root logger kept
    from verl.protocol import DataProto

    n = len(samples)
    prompt_width = max((len(s.prompt) for s in samples), default=0)
    width = max(1, max((len(s.response) for s in samples), default=0))
    prompts = torch.full((n, prompt_width), pad_token_id, dtype=torch.long)
    prompt_attention = torch.zeros((n, prompt_width), dtype=torch.long)
    responses = torch.full((n, width), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.long)
    logprobs = torch.zeros((n, width), dtype=torch.float32)
    scores = torch.zeros((n, width), dtype=torch.float32)
    for b, sample in enumerate(samples):
        p, r = len(sample.prompt), len(sample.response)
        if p:
            prompts[b, prompt_width - p :] = torch.tensor(sample.prompt)
            prompt_attention[b, prompt_width - p :] = 1
        if r:
            responses[b, :r] = torch.tensor(sample.response)
            response_attention[b, :r] = 1
            response_mask[b, :r] = torch.tensor(sample.response_mask)
            logprobs[b, :r] = torch.tensor(sample.logprobs)
        # The reward on the last response token, as verl's agent loop puts it; a rollout without a
        # token here (another adapter's agents made its calls) keeps its reward for its group's sums.
        scores[b, max(r - 1, 0)] = sample.reward
    attention = torch.cat([prompt_attention, response_attention], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
        "rollout_log_probs": logprobs,
        "rm_scores": scores,
        "token_level_scores": scores.clone(),
        "token_level_rewards": scores.clone(),
    }
    non_tensors = {
        "uid": np.array([s.uid for s in samples], dtype=object),
        "rollout_id": np.array([s.rollout_id for s in samples], dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def to_data_proto(trajectories: Sequence[Trajectory], *, pad_token_id: int = 0) -> Any:
    """One verl sample per trajectory row, laid out as verl's agent loop lays one out (see the module
    docstring). A rollout that fulgor split into several rows gives several samples, each with the
    rollout's reward and ``uid``; ``rollout_id`` says which samples are one rollout's."""
    samples = [_row_sample(t, row) for t in trajectories for row in t.rows]
    if not samples:
        raise ConfigError("there are no trajectory rows to convert; pass at least one trajectory with a row")
    return _data_proto(samples, pad_token_id)


def compute_advantages(data: Any, name: str, *, gamma: float = 1.0) -> torch.Tensor:
    """verl's estimator ``name`` (``verl:NAME``) on ``data``: ``advantages[N, L]`` over its responses.

    The estimator is called as verl's trainer calls it (``compute_advantage`` in
    verl/trainer/ppo/ray_trainer.py): ``token_level_rewards``, ``response_mask``, ``uid`` as
    ``index`` and verl's ``AlgoConfig`` (``gamma`` for the discounting estimators).
    """
    function = check_advantage(name)
    from verl.trainer.config import AlgoConfig

    advantages, _ = function(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        config=AlgoConfig(adv_estimator=name.removeprefix(PREFIX), gamma=gamma),
    )
    result: torch.Tensor = advantages
    return result


def token_advantages(
    trajectories: Sequence[Trajectory], name: str, *, gamma: float = 1.0
) -> list[list[torch.Tensor]]:
    """verl's estimator ``name`` on ``trajectories``: per trajectory, per row, ``[len(row)]`` advantages
    (0 before the row's response).

    Each rollout is one verl sample, as verl's agent loop makes one sample of a multi-turn
    conversation: the responses of its rows are joined for the estimator, so a rollout that fulgor
    split into rows counts once in its group, and its advantages are split back onto the rows.
    """
    import torch

    if not trajectories:
        raise ConfigError("advantages need at least one trajectory")
    advantages = compute_advantages(
        _data_proto([_rollout_sample(t) for t in trajectories], 0), name, gamma=gamma
    )
    result: list[list[torch.Tensor]] = []
    for index, trajectory in enumerate(trajectories):
        offset, rows = 0, []
        for row in trajectory.rows:
            start = _response_start(row)
            values = torch.zeros(len(row.token_ids), dtype=torch.float32)
            values[start:] = advantages[index, offset : offset + len(row.token_ids) - start]
            offset += len(row.token_ids) - start
            rows.append(values)
        result.append(rows)
    return result


class VerlPolicyLoss:
    """verl's policy loss ``name`` (``verl:NAME``) with fulgor's clip range.

    Each row is a sequence and the loss is verl's ``seq-mean-token-mean``: the mean over each row's
    sampled tokens, then over the batch's rows. Call :meth:`start_batch` with the whole batch's row
    and token counts before its micro-batches: their losses then add up to the whole batch's loss
    (verl's ``global_batch_info``).
    """

    def __init__(self, name: str, *, clip_low: float, clip_high: float, micro_batch_size: int) -> None:
        self.function = check_policy_loss(name)
        from verl.workers.config import ActorConfig, PolicyLossConfig

        self.config = ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=micro_batch_size,
            clip_ratio=clip_low,
            clip_ratio_low=clip_low,
            clip_ratio_high=clip_high,
            loss_agg_mode="seq-mean-token-mean",
            policy_loss=PolicyLossConfig(loss_mode=name.removeprefix(PREFIX)),
        )

    def start_batch(self, rows: int, tokens: float) -> None:
        """The whole batch's count of rows with a sampled token, and of sampled tokens."""
        self.config.global_batch_info.update(
            dp_size=1, batch_num_tokens=tokens, global_batch_size=rows, loss_scale_factor=None
        )

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, float]:
        """The loss of a micro-batch (``[B, T]`` each, ``weights`` the importance weights or None) and
        the share of its sampled tokens whose ratio was clipped (0.0 when the loss reports none)."""
        loss, metrics = self.function(
            old_log_prob=old_logprobs,
            log_prob=logprobs,
            advantages=advantages,
            response_mask=loss_mask > 0,
            loss_agg_mode=self.config.loss_agg_mode,
            config=self.config,
            rollout_is_weights=weights,
        )
        return loss, float(metrics.get("actor/pg_clipfrac", 0.0))
