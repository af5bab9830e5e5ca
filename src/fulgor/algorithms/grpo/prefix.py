"""Shared prefixes: rows of a batch that begin with the same tokens compute those tokens once.

Two kinds of batch make this pay: a GRPO group (every completion of a task repeats its prompt) and
agent conversations (every row starts with the same system prompt and tool definitions).

``plan`` finds the groups of rows that share a prefix (lexicographic order puts them next to each
other). A prefix stops before the first position whose hidden state the row's loss reads, so every
output the loss reads comes from the row's own forward. ``schedule`` arranges a batch into waves:
each wave runs the decoder once over the prefixes of up to a micro-batch's worth of groups
(:class:`SharedPrefixes`: one row per group, into a key/value cache), then its rows in micro-batches
sorted by the length of what follows their prefix. Each of those forwards reads its rows' keys and
values from the cache, with positions offset by the prefix length and an attention mask that hides
the prefix slots a row does not own: a row's tokens see the keys and positions they see in one
plain forward, so the hidden states are the same up to float rounding.

The rows read detached copies of the prefix forward's keys and values, whose gradients add up over
every micro-batch of the wave; :meth:`SharedPrefixes.backward` then sends the sum through the prefix
forward once. Every weight gets the gradient of the plain forward, and a prefix is computed once
forward and once backward however its rows are split into micro-batches.

What it does not know: the LM head or the loss (the caller applies the head to the hidden states
it gets back), or which model classes are plain decoders (the caller decides; ``supports`` checks
the decoder settings under which two forwards would differ from one).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["MIN_SHARED_TOKENS", "Plan", "SharedPrefixes", "Wave", "plan", "schedule", "supports"]

# A group needs at least two rows sharing at least this many tokens, or computing its prefix apart
# costs about what it saves.
MIN_SHARED_TOKENS = 16
# Rotary embeddings whose frequencies depend on the longest position in the call (transformers'
# ``dynamic_rope_update``): two calls could see other frequencies than one.
_CALL_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


@dataclass(frozen=True)
class Plan:
    """Rows in groups: group ``g`` is the first ``prefix_lengths[g]`` tokens of row ``prefix_rows[g]``;
    row ``b`` shares ``shared[b]`` tokens with group ``group[b]`` (0 and 0 for a row that shares
    nothing). Every row keeps at least one token of its own."""

    prefix_rows: list[int]
    prefix_lengths: list[int]
    group: list[int]
    shared: list[int]


@dataclass(frozen=True)
class Wave:
    """Micro-batches ``parts`` (row indices) that read one forward over the prefixes of ``plan``,
    which numbers the wave's ``rows`` in this order; without a plan the rows share nothing (and
    ``rows`` is empty)."""

    parts: list[list[int]]
    rows: list[int]
    plan: Plan | None


def plan(rows: Sequence[Sequence[int]], limits: Sequence[int]) -> Plan | None:
    """The groups of ``rows`` (token ids, unpadded) that share a prefix of at most ``limits[b]`` tokens
    for row ``b``; None when none do.

    A group is a run of rows in lexicographic order whose neighbours share at least
    ``MIN_SHARED_TOKENS`` tokens; its prefix is what all its rows share, cut to the least of its rows'
    limits. A limit is where the row's first read hidden state is (the caller's loss reads no hidden
    state inside a prefix) and at most one short of the row's length (its last token predicts nothing).
    """
    groups = [run for run in _runs(rows, limits) if len(run[0]) > 1 and run[1] >= MIN_SHARED_TOKENS]
    if not groups:
        return None
    group, shared = [0] * len(rows), [0] * len(rows)
    for g, (members, length) in enumerate(groups):
        for b in members:
            group[b], shared[b] = g, length
    return Plan([members[0] for members, _ in groups], [n for _, n in groups], group, shared)


def schedule(rows: Sequence[Sequence[int]], limits: Sequence[int], size: int) -> list[Wave]:
    """``rows`` in micro-batches of up to ``size`` rows, in waves that each compute the prefixes of up
    to ``size`` groups once (so a wave's prefix forward is no larger than a micro-batch); rows that
    share nothing come last. Within a wave, rows are sorted by what follows their prefix, longest
    first, so little of the work goes to padding. When that computes no fewer token positions than
    micro-batches of rows sorted by length, it is one wave of those, without a plan. ``limits`` as
    for :func:`plan`.
    """
    plain = [Wave(_chunks(sorted(range(len(rows)), key=lambda b: -len(rows[b])), size), [], None)]
    whole = plan(rows, limits)
    if whole is None:
        return plain
    by_length = sorted(range(len(whole.prefix_rows)), key=lambda g: -whole.prefix_lengths[g])
    waves = []
    for start in range(0, len(by_length), size):
        groups = by_length[start : start + size]
        members = [b for b in range(len(rows)) if whole.shared[b] and whole.group[b] in groups]
        order = sorted(members, key=lambda b: whole.shared[b] - len(rows[b]))
        waves.append(Wave(_chunks(order, size), members, _restricted(whole, members, groups)))
    alone = sorted((b for b in range(len(rows)) if not whole.shared[b]), key=lambda b: -len(rows[b]))
    if alone:
        waves.append(Wave(_chunks(alone, size), [], None))
    return waves if _positions(rows, waves) < _positions(rows, plain) else plain


def _restricted(whole: Plan, members: list[int], groups: list[int]) -> Plan:
    """``whole`` for rows ``members`` (of ``groups`` only), numbered as they are listed."""
    index = {b: i for i, b in enumerate(members)}
    renumbered = {g: i for i, g in enumerate(groups)}
    return Plan(
        [index[whole.prefix_rows[g]] for g in groups],
        [whole.prefix_lengths[g] for g in groups],
        [renumbered[whole.group[b]] for b in members],
        [whole.shared[b] for b in members],
    )


def _positions(rows: Sequence[Sequence[int]], waves: list[Wave]) -> int:
    """Token positions the forwards of ``waves`` compute, padding included."""
    total = 0
    for wave in waves:
        shared: dict[int, int] = {}
        if wave.plan is not None:
            shared = dict(zip(wave.rows, wave.plan.shared, strict=True))
            total += len(wave.plan.prefix_rows) * max(wave.plan.prefix_lengths)
        total += sum(len(part) * max(len(rows[b]) - shared.get(b, 0) for b in part) for part in wave.parts)
    return total


def _chunks(order: list[int], size: int) -> list[list[int]]:
    return [order[start : start + size] for start in range(0, len(order), size)]


def _runs(rows: Sequence[Sequence[int]], limits: Sequence[int]) -> list[tuple[list[int], int]]:
    """Runs of rows in lexicographic order whose neighbours share ``MIN_SHARED_TOKENS`` tokens or more,
    with what the whole run may share (the least its neighbours share, and the least of its rows'
    limits, each at most one short of the row's length)."""
    runs: list[tuple[list[int], int]] = []
    previous: Sequence[int] | None = None
    for b in sorted(range(len(rows)), key=lambda b: list(rows[b])):
        common = 0 if previous is None else _common_length(previous, rows[b])
        if runs and common >= MIN_SHARED_TOKENS:
            members, length = runs[-1]
            runs[-1] = ([*members, b], min(length, common, limits[b], len(rows[b]) - 1))
        else:
            runs.append(([b], min(limits[b], len(rows[b]) - 1)))
        previous = rows[b]
    return runs


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), n)


def supports(decoder: Any, width: int) -> bool:
    """Whether ``decoder``'s settings let a prefix and the rest run as two forwards (with a cache and
    the rest together ``width`` slots wide) that compute what one forward does.

    Only under transformers 5 (the cache interface this was checked against) with eager or SDPA
    attention (their masks take the 2D padding mask as given); not under gradient checkpointing (the
    cache would be dropped or written twice), not with active dropout (a prefix would draw one mask
    for all its rows), not with rotary frequencies that depend on the call, and not where a sliding
    window would cut the cache (its window counts cache slots, and the cache has gaps).
    """
    import torch
    import transformers

    config = decoder.config
    if int(transformers.__version__.split(".")[0]) < 5:
        return False
    if getattr(config, "_attn_implementation", None) not in ("eager", "sdpa"):
        return False
    for module in decoder.modules():
        if getattr(module, "gradient_checkpointing", False):
            return False
        if decoder.training and isinstance(module, torch.nn.Dropout) and module.p > 0:
            return False
    if decoder.training and getattr(config, "attention_dropout", 0.0) > 0:
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) in _CALL_DEPENDENT_ROPE:
        return False
    window = getattr(config, "sliding_window", None)
    return window is None or width <= window


class SharedPrefixes:
    """One decoder forward over the prefixes of ``plan`` (one row per group, from ``rows``), whose keys
    and values the forwards of those rows read (:meth:`hidden_states`); with gradients on,
    :meth:`backward` after all their backwards completes the gradient."""

    def __init__(self, decoder: Any, rows: Sequence[Sequence[int]], plan: Plan) -> None:
        from transformers import DynamicCache

        self.decoder = decoder
        device = next(decoder.parameters()).device
        prefixes = [rows[b][:n] for b, n in zip(plan.prefix_rows, plan.prefix_lengths, strict=True)]
        ids, mask = _right_padded(prefixes, device)
        cache = DynamicCache()
        self._forward(ids, mask, (mask.cumsum(1) - 1).clamp(min=0), cache)
        # Per layer: keys and values [groups, kv heads, prefix slots, head dim].
        self._outputs = [(layer[0], layer[1]) for layer in cache]
        self._read = [tuple(_detached(out) for out in pair) for pair in self._outputs]
        self._width = ids.shape[1]
        self._groups = {
            tuple(row): (g, n) for row, g, n in zip(rows, plan.group, plan.shared, strict=True) if n
        }

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, chosen: torch.Tensor
    ) -> torch.Tensor:
        """The decoder's last hidden states ``[N, H]`` at the ``N`` true positions of ``chosen[B, T - 1]``
        (row-major), for rows ``input_ids[B, T]`` (right-padded as ``attention_mask``), none of them
        inside the row's shared prefix; a row that is not one of this object's ``rows`` computes all
        its tokens itself."""
        import torch
        from transformers import DynamicCache

        device = input_ids.device
        lengths = attention_mask.sum(1).tolist()
        rows = [ids[:n] for ids, n in zip(input_ids.tolist(), lengths, strict=True)]
        group, shared = zip(*(self._groups.get(tuple(row), (0, 0)) for row in rows), strict=True)
        offset = torch.tensor(shared, device=device)
        b, t = chosen.nonzero(as_tuple=True)
        if bool((t < offset[b]).any()):
            raise ValueError("a position read inside a shared prefix; plan with the rows' loss masks")
        cache = DynamicCache()
        index = torch.tensor(group, device=device)
        for layer, (keys, values) in enumerate(self._read):
            cache.update(keys[index], values[index], layer)  # [groups, ...] -> [rows, ...]
        rest_ids, rest_mask = _right_padded([row[n:] for row, n in zip(rows, shared, strict=True)], device)
        owned = torch.arange(self._width, device=device) < offset[:, None]
        mask = torch.cat([owned.long(), rest_mask], 1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, self._width :]
        rest: torch.Tensor = self._forward(rest_ids, mask, positions, cache)
        return rest[b, t - offset[b]]

    def backward(self) -> None:
        """Send the gradients that the rows' backwards left on the prefix's keys and values through
        the prefix forward (once, for all of them); then the prefix's graph and cache are let go."""
        import torch

        pairs = [
            (out, read.grad)
            for outs, reads in zip(self._outputs, self._read, strict=True)
            for out, read in zip(outs, reads, strict=True)
            if read is not out and read.grad is not None
        ]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self._outputs, self._read = [], []

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> Any:
        keyword = (
            "cache" if "cache" in inspect.signature(self.decoder.forward).parameters else "past_key_values"
        )
        return self.decoder(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{keyword: cache}
        ).last_hidden_state


def _detached(tensor: torch.Tensor) -> torch.Tensor:
    """A leaf copy that gathers the gradient of everything that reads it (``tensor`` itself when it
    has no gradient, e.g. under ``torch.no_grad``)."""
    return tensor.detach().requires_grad_() if tensor.requires_grad else tensor


def _right_padded(rows: Sequence[Sequence[int]], device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` as ids and attention mask ``[len(rows), longest]``, right-padded with 0."""
    import torch

    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, : len(row)] = 1
    return ids.to(device), mask.to(device)
