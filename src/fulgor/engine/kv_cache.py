"""The running batch's KV cache: merging newly prefilled rows in, and dropping finished rows.

Rows are left-padded to a common cache length; the attention mask marks the padding. Keys are cached
after rotary embedding with each row's own positions, so padding a cache on the left changes nothing
a row computes. Caches are transformers ``DynamicCache`` objects, read and rebuilt only through calls
that exist across releases (iteration and ``update``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fulgor.engine.scheduler import Sequence

__all__ = ["BatchState", "cache_layers", "merge", "new_cache", "select"]


@dataclass
class BatchState:
    """The running batch: KV cache tensors per layer, mask over cached positions, next inputs."""

    rows: list[Sequence]
    cache: Any
    mask: Any
    positions: Any
    last_tokens: Any


def new_cache(layers: list[tuple[Any, Any]] | None = None) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for index, (keys, values) in enumerate(layers or []):
        cache.update(keys, values, index)
    return cache


def cache_layers(cache: Any) -> list[tuple[Any, Any]]:
    # Iterating a DynamicCache yields (keys, values, ...) per layer across transformers releases.
    return [(entry[0], entry[1]) for entry in cache]


def _pad_left(torch: Any, tensor: Any, amount: int, dim: int) -> Any:
    if amount == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = amount
    return torch.cat([torch.zeros(shape, dtype=tensor.dtype, device=tensor.device), tensor], dim=dim)


def merge(running: BatchState, fresh: BatchState) -> BatchState:
    import torch

    """Concatenate two batches along the batch axis, left-padding the shorter cache."""
    width = max(running.mask.shape[1], fresh.mask.shape[1])
    layers = []
    for (k1, v1), (k2, v2) in zip(cache_layers(running.cache), cache_layers(fresh.cache), strict=True):
        pad1, pad2 = width - k1.shape[2], width - k2.shape[2]
        keys = torch.cat([_pad_left(torch, k1, pad1, 2), _pad_left(torch, k2, pad2, 2)], dim=0)
        values = torch.cat([_pad_left(torch, v1, pad1, 2), _pad_left(torch, v2, pad2, 2)], dim=0)
        layers.append((keys, values))
    mask = torch.cat(
        [
            _pad_left(torch, running.mask, width - running.mask.shape[1], 1),
            _pad_left(torch, fresh.mask, width - fresh.mask.shape[1], 1),
        ],
        dim=0,
    )
    return BatchState(
        rows=running.rows + fresh.rows,
        cache=new_cache(layers),
        mask=mask,
        positions=torch.cat([running.positions, fresh.positions]),
        last_tokens=torch.cat([running.last_tokens, fresh.last_tokens]),
    )


def select(batch: BatchState, keep: list[int]) -> BatchState:
    import torch

    """Keep some rows, then drop leading cache columns that are padding in every kept row."""
    index = torch.tensor(keep, dtype=torch.long, device=batch.mask.device)
    mask = batch.mask.index_select(0, index)
    first = int(mask.any(dim=0).nonzero()[0].item())
    layers = [
        (k.index_select(0, index)[:, :, first:], v.index_select(0, index)[:, :, first:])
        for k, v in cache_layers(batch.cache)
    ]
    return BatchState(
        rows=[batch.rows[i] for i in keep],
        cache=new_cache(layers),
        mask=mask[:, first:],
        positions=batch.positions.index_select(0, index),
        last_tokens=batch.last_tokens.index_select(0, index),
    )
