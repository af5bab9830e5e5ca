"""The batching engine's correctness: exact logprobs, determinism, batch invariance, swaps, cancel."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.engine_support import until  # noqa: E402

from fulgor.engine.errors import ContextLengthError  # noqa: E402
from fulgor.engine.local import EngineConfig, LocalEngine  # noqa: E402
from fulgor.engine.sampling import SamplingParams  # noqa: E402
from fulgor.engine.scheduler import FinishEvent, TokenEvent  # noqa: E402

PROMPTS = [
    "What is 2 + 3?",
    "Hello there, please tell me about the river and the city and the country.",
    "a",
    "The answer is",
    "<tool_call>",
    "Compute 120 * 4 and then add 7, step by step",
]


@pytest.fixture
def engine(tiny_model: Any, tiny_model_dir: Path) -> Iterator[LocalEngine]:
    local = LocalEngine(tiny_model, EngineConfig(model=tiny_model_dir, seed=0, max_batch_size=32))
    local.start()
    yield local
    local.close()


def _encode(engine: LocalEngine, text: str) -> list[int]:
    ids: list[int] = engine.tokenizer.encode(text, add_special_tokens=False)
    return ids


async def _run(
    engine: LocalEngine, prompt: list[int], params: SamplingParams, delay: float = 0.0
) -> FinishEvent:
    await asyncio.sleep(delay)
    async for _, event in engine.generate(prompt, [params]):
        if isinstance(event, FinishEvent):
            return event
    raise AssertionError("no finish event")


def _recomputed_logprobs(engine: LocalEngine, prompt: list[int], output: list[int]) -> Any:
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = engine.model.model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(-1, torch.tensor(output)[:, None]).squeeze(-1)


async def test_logprobs_equal_an_independent_forward_pass(engine: LocalEngine) -> None:
    params = SamplingParams(max_tokens=24, temperature=1.0)
    prompts = [_encode(engine, p) for p in PROMPTS]
    # Staggered arrivals join the running batch at later steps, with caches of different lengths.
    results = await asyncio.gather(*(_run(engine, p, params, delay=0.01 * i) for i, p in enumerate(prompts)))
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids
        expected = _recomputed_logprobs(engine, prompt, result.token_ids)
        assert torch.max(torch.abs(expected - torch.tensor(result.logprobs))).item() <= 1e-4


async def test_pad_tokens_inside_a_prompt_are_attended_to(engine: LocalEngine) -> None:
    pad = engine.model.pad_token_id
    prompt = [*_encode(engine, "one two"), pad, pad, *_encode(engine, "three"), pad]
    others = [_encode(engine, p) for p in PROMPTS[:3]]
    params = SamplingParams(max_tokens=12, temperature=1.0)
    results = await asyncio.gather(*(_run(engine, p, params) for p in [prompt, *others]))
    expected = _recomputed_logprobs(engine, prompt, results[0].token_ids)
    assert torch.max(torch.abs(expected - torch.tensor(results[0].logprobs))).item() <= 1e-4


async def test_greedy_decoding_is_deterministic(engine: LocalEngine) -> None:
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    prompt = _encode(engine, PROMPTS[1])
    first = await _run(engine, prompt, greedy)
    second = await _run(engine, prompt, greedy)
    assert first.token_ids == second.token_ids
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-5)


async def test_batched_and_unbatched_greedy_outputs_are_identical(engine: LocalEngine) -> None:
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    prompts = [_encode(engine, p) for p in PROMPTS * 3]
    batched = await asyncio.gather(*(_run(engine, p, greedy, delay=0.002 * i) for i, p in enumerate(prompts)))
    for prompt, together in zip(prompts, batched, strict=True):
        alone = await _run(engine, prompt, greedy)
        assert together.token_ids == alone.token_ids


async def test_a_seed_reproduces_a_sample_in_any_batch(engine: LocalEngine) -> None:
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=123)
    prompt = _encode(engine, PROMPTS[0])
    alone = await _run(engine, prompt, seeded)
    crowd = [_run(engine, _encode(engine, p), SamplingParams(max_tokens=12)) for p in PROMPTS]
    together, *_ = await asyncio.gather(_run(engine, prompt, seeded), *crowd)
    assert together.token_ids == alone.token_ids


async def test_stop_conditions(engine: LocalEngine) -> None:
    prompt = _encode(engine, PROMPTS[3])
    length = await _run(engine, prompt, SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True))
    assert (len(length.token_ids), length.finish_reason) == (5, "length")
    greedy = await _run(engine, prompt, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    stop_at = greedy.text[len(greedy.text) // 2 :][:3]
    assert stop_at
    stopped = await _run(engine, prompt, SamplingParams(max_tokens=20, temperature=0.0, stop=(stop_at,)))
    assert stopped.finish_reason == "stop"
    assert stop_at not in stopped.text
    assert greedy.text.startswith(stopped.text)
    assert (length.stop_reason, greedy.stop_reason, stopped.stop_reason) == (None, None, stop_at)


async def test_a_stop_token_id_ends_the_sequence_without_adding_text(engine: LocalEngine) -> None:
    prompt = _encode(engine, PROMPTS[3])
    seeded = SamplingParams(max_tokens=20, seed=3, ignore_eos=True)
    ids = (await _run(engine, prompt, seeded)).token_ids
    at = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    for stream in (False, True):
        params = dataclasses.replace(seeded, stop_token_ids=(ids[at],))
        events = [event async for _, event in engine.generate(prompt, [params], stream=stream)]
        finish = events[-1]
        assert isinstance(finish, FinishEvent)
        assert (finish.finish_reason, finish.stop_reason) == ("stop", ids[at])
        assert finish.token_ids == ids[: at + 1]
        assert finish.text == engine.tokenizer.decode(ids[:at], skip_special_tokens=True)
        streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert finish.text.startswith(streamed)


async def test_streamed_tokens_match_the_finished_sequence(engine: LocalEngine) -> None:
    prompt = _encode(engine, PROMPTS[0])
    tokens: list[int] = []
    text = ""
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    async for _, event in engine.generate(prompt, [params], stream=True):
        if isinstance(event, TokenEvent):
            tokens.append(event.token_id)
            text += event.text
        elif isinstance(event, FinishEvent):
            assert event.token_ids == tokens
            assert event.text.startswith(text)


async def test_leaving_early_cancels_the_sequence(engine: LocalEngine) -> None:
    params = SamplingParams(max_tokens=1000, temperature=1.0, ignore_eos=True)
    async for _, event in engine.generate(_encode(engine, PROMPTS[0]), [params], stream=True):
        assert isinstance(event, TokenEvent)
        break
    await until(lambda: engine.stats()["running"] == 0)


async def test_a_request_arriving_mid_generation_joins_the_running_batch(engine: LocalEngine) -> None:
    long_params = SamplingParams(max_tokens=400, temperature=1.0, ignore_eos=True)
    running = asyncio.create_task(_run(engine, _encode(engine, PROMPTS[0]), long_params))
    await until(lambda: engine.stats()["running"] == 1)
    short = await _run(engine, _encode(engine, PROMPTS[1]), SamplingParams(max_tokens=3, ignore_eos=True))
    # The late request ran next to the long one and finished first: it did not wait for the batch.
    assert len(short.token_ids) == 3
    assert not running.done()
    assert len((await running).token_ids) == 400


async def test_a_swap_waits_for_running_sequences(engine: LocalEngine, tiny_model_dir: Path) -> None:
    long_params = SamplingParams(max_tokens=400, temperature=1.0, ignore_eos=True)
    running = asyncio.create_task(_run(engine, _encode(engine, PROMPTS[0]), long_params))
    await until(lambda: engine.stats()["running"] == 1)
    swap = asyncio.create_task(engine.swap_weights(tiny_model_dir))
    await until(lambda: engine.stats()["swap_pending"] == 1)
    assert engine.stats()["running"] == 1
    # A request that arrives while the swap waits runs on the new version.
    late = asyncio.create_task(_run(engine, _encode(engine, PROMPTS[1]), SamplingParams(max_tokens=3)))
    first, result, after = await asyncio.gather(running, swap, late)
    assert len(first.token_ids) == 400
    assert first.model_version == 0
    assert result.model_version == 1
    assert after.model_version == 1
    assert engine.model_version == 1


def test_context_limits(engine: LocalEngine) -> None:
    limit = engine.max_model_len
    assert engine.check_context(10, None) == limit - 10
    assert engine.check_context(10, 20) == 20
    with pytest.raises(ContextLengthError, match=str(limit)):
        engine.check_context(limit - 5, 10)
    with pytest.raises(ContextLengthError, match="maximum context length"):
        engine.check_context(limit, None)
