"""Sampling parameters and the per-step sampler of the local engine.

Reported logprobs are those of the model's own distribution (log-softmax of the raw logits, in
float32), before temperature and top-p, as vLLM reports them by default: training recomputes exactly
these with a forward pass over the same ids. Temperature and top-p shape only which token is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_TOP_LOGPROBS", "SamplingParams", "StepSample", "sample_step"]

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is sampled; validated by the HTTP layer before it gets here."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    ignore_eos: bool = False


@dataclass
class StepSample:
    """The tokens drawn for every row of a batch in one step, with their logprobs."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]


def _apply_top_p(torch: Any, scaled: Any, top_p: Any) -> Any:
    """Mask logits outside each row's nucleus (the smallest set whose probability reaches top_p)."""
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))


def _draw(torch: Any, logits: Any, params: list[SamplingParams], generators: list[Any], shared: Any) -> Any:
    """One token per row: argmax for temperature 0, else a draw from the tempered nucleus."""
    chosen = torch.argmax(logits, dim=-1)
    sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if not sampled_rows:
        return chosen
    index = torch.tensor(sampled_rows, device=logits.device)
    temperature = torch.tensor([params[i].temperature for i in sampled_rows], device=logits.device)
    top_p = torch.tensor([params[i].top_p for i in sampled_rows], device=logits.device)
    scaled = logits.index_select(0, index) / temperature[:, None]
    if bool((top_p < 1.0).any()):
        scaled = _apply_top_p(torch, scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)
    unseeded = [k for k, i in enumerate(sampled_rows) if generators[i] is None]
    if unseeded:
        rows = torch.tensor(unseeded, device=logits.device)
        drawn = torch.multinomial(probs.index_select(0, rows), 1, generator=shared).squeeze(-1)
        chosen[index[rows]] = drawn
    for k, i in enumerate(sampled_rows):
        if generators[i] is not None:
            chosen[i] = torch.multinomial(probs[k], 1, generator=generators[i])[0]
    return chosen


def sample_step(
    logits: Any, params: list[SamplingParams], generators: list[Any], shared_generator: Any
) -> StepSample:
    """Draw one token per row of ``logits`` ([rows, vocab]) and report raw-distribution logprobs.

    ``generators[i]`` is row i's own ``torch.Generator`` (requests with a seed) or None, in which
    case the engine-wide ``shared_generator`` draws it.
    """
    import torch

    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = _draw(torch, logits, params, generators, shared_generator)
    chosen_logprobs = logprobs.gather(-1, chosen[:, None]).squeeze(-1)
    top_counts = [p.top_logprobs for p in params]
    top: list[list[tuple[int, float]]] = [[] for _ in params]
    if max(top_counts, default=0) > 0:
        values, indices = torch.topk(logprobs, k=max(top_counts), dim=-1)
        for i, count in enumerate(top_counts):
            top[i] = list(zip(indices[i, :count].tolist(), values[i, :count].tolist(), strict=True))
    return StepSample(chosen.tolist(), chosen_logprobs.tolist(), top)
