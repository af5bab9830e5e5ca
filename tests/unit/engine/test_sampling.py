"""The sampler: greedy, temperature and top-p draws, seeds, and raw-distribution logprobs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fulgor.engine.sampling import SamplingParams, sample_step  # noqa: E402


def _shared() -> object:
    return torch.Generator().manual_seed(0)


def test_greedy_picks_the_argmax_and_reports_raw_logprobs() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    params = [SamplingParams(max_tokens=1, temperature=0.0)] * 2
    sample = sample_step(logits, params, [None, None], _shared())
    assert sample.token_ids == [1, 0]
    expected = torch.log_softmax(logits, dim=-1)
    assert sample.logprobs == pytest.approx([expected[0, 1].item(), expected[1, 0].item()], abs=1e-6)


def test_logprobs_ignore_temperature_and_top_p() -> None:
    logits = torch.tensor([[1.0, 1.5, 0.2, -0.3]])
    params = [SamplingParams(max_tokens=1, temperature=0.3, top_p=0.5, seed=1)]
    sample = sample_step(logits, params, [torch.Generator().manual_seed(1)], _shared())
    raw = torch.log_softmax(logits, dim=-1)[0, sample.token_ids[0]].item()
    assert sample.logprobs[0] == pytest.approx(raw, abs=1e-6)


def test_top_p_keeps_only_the_nucleus() -> None:
    # Probabilities about 0.64, 0.24, 0.09, 0.03: top_p 0.7 keeps the first two tokens only.
    logits = torch.log(torch.tensor([[0.64, 0.24, 0.09, 0.03]]))
    params = [SamplingParams(max_tokens=1, temperature=1.0, top_p=0.7)]
    seen = {
        sample_step(logits, params, [None], torch.Generator().manual_seed(s)).token_ids[0] for s in range(200)
    }
    assert seen == {0, 1}


def test_a_seeded_row_draws_the_same_token_whatever_its_neighbours() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    seeded = SamplingParams(max_tokens=1, temperature=1.0, seed=7)
    alone = sample_step(logits, [seeded], [torch.Generator().manual_seed(7)], _shared())
    batch = torch.cat([torch.randn(2, 50), logits])
    params = [SamplingParams(max_tokens=1), SamplingParams(max_tokens=1, temperature=0.0), seeded]
    together = sample_step(batch, params, [None, None, torch.Generator().manual_seed(7)], _shared())
    assert together.token_ids[2] == alone.token_ids[0]


def test_top_logprobs_are_the_largest_in_order() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    params = [SamplingParams(max_tokens=1, temperature=0.0, top_logprobs=3)]
    sample = sample_step(logits, params, [None], _shared())
    assert [token for token, _ in sample.top_logprobs[0]] == [1, 3, 2]
    assert sample.top_logprobs[0][0][1] == pytest.approx(sample.logprobs[0])
