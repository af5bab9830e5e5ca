"""Supervised fine-tuning on rows made from chat transcripts, with a locally built model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from fulgor.adapters import Trajectory, TrajectoryRow
from fulgor.algorithms.grpo.update import collate, waves
from fulgor.algorithms.sft import SFTConfig, SFTUpdater, chat_row
from fulgor.engine.prompts import chat_prompt_ids, render_chat_ids
from fulgor.engine.protocol import ChatCompletionRequest, ChatMessage
from fulgor.errors import ConfigError

transformers = pytest.importorskip("transformers")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
TRANSCRIPT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 12 times 7?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*7"}}}
        ],
    },
    {"role": "tool", "content": "84"},
    {"role": "assistant", "content": "84"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fulgor.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("sft") / "tiny", "tiny", seed=0)


def test_chat_row_trains_only_what_the_model_emits(model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    row = chat_row(tokenizer, TRANSCRIPT, TOOLS)
    messages = [ChatMessage.model_validate(m) for m in TRANSCRIPT]
    assert row.token_ids == render_chat_ids(tokenizer, messages, TOOLS, add_generation_prompt=False)
    assert len(row.loss_mask) == len(row.token_ids)
    trained = [t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if m]
    # Exactly the two completions: the tool call and the answer, each closed by the end-of-turn token.
    call = tokenizer.encode(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>',
        add_special_tokens=False,
    )
    eos = tokenizer.eos_token_id
    assert trained == [*call, eos, *tokenizer.encode("84", add_special_tokens=False), eos]
    context = tokenizer.decode([t for t, m in zip(row.token_ids, row.loss_mask, strict=True) if not m])
    assert "12 times 7" in context
    assert "<tool_response>" in context


def test_a_turn_ends_at_the_token_the_engine_stops_on(model_dir: Path) -> None:
    """A tokenizer whose eos is not the template's end of turn (a base model's): the engine stops on
    the model's end-of-turn id, and passing it as ``stop_token_ids`` trains exactly that turn."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    expected = chat_row(tokenizer, TRANSCRIPT, TOOLS)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token = "<|endoftext|>"
    row = chat_row(tokenizer, TRANSCRIPT, TOOLS, stop_token_ids={im_end, tokenizer.eos_token_id})
    assert row.token_ids == expected.token_ids
    assert row.loss_mask == expected.loss_mask
    # Without the engine's stop ids the turn would run on past its end into template text.
    assert sum(chat_row(tokenizer, TRANSCRIPT, TOOLS).loss_mask) > sum(expected.loss_mask)


def test_chat_row_prompts_are_the_engines_prompts(model_dir: Path) -> None:
    """Each assistant turn starts right after the ids the engine's server renders for that request."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    row = chat_row(tokenizer, TRANSCRIPT, TOOLS)
    for turn in (1, 3):
        request = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": TRANSCRIPT[:turn], "tools": TOOLS}
        )
        prompt = chat_prompt_ids(tokenizer, request)
        assert row.token_ids[: len(prompt)] == prompt
        assert row.loss_mask[len(prompt) - 1] == 0
        assert row.loss_mask[len(prompt)] == 1


def test_chat_row_refuses_a_transcript_without_an_assistant_turn(model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(ConfigError, match="no assistant turn"):
        chat_row(tokenizer, TRANSCRIPT[:1], TOOLS)


def test_fine_tuning_lowers_the_loss_of_the_trained_tokens(model_dir: Path) -> None:
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    row = chat_row(tokenizer, TRANSCRIPT, TOOLS)
    before = _mean_logprobs(model, row)
    updater = SFTUpdater(model, SFTConfig(learning_rate=3e-3))
    first = updater.step_rows([row])
    for _ in range(30):
        last = updater.step_rows([row])
    assert last["loss"] < first["loss"] / 2
    assert first["trained_tokens"] == sum(row.loss_mask)
    after = _mean_logprobs(model, row)
    # The assistant's tokens became far more likely; the context was not what was trained on.
    assert after[1] - before[1] > after[0] - before[0]


def _mean_logprobs(model: Any, row: TrajectoryRow) -> tuple[float, float]:
    """Mean log-probability of the context tokens (mask 0) and of the trained tokens (mask 1)."""
    from fulgor.algorithms.grpo.update import token_logprobs

    ids = torch.tensor([row.token_ids])
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, ids, torch.ones_like(ids))
    mask = torch.tensor(row.loss_mask, dtype=torch.float32)
    context = (1 - mask)[1:]  # position 0 has no prediction
    values = logprobs[0, 1:]
    return float((values * context).sum() / context.sum()), float((values * mask[1:]).sum() / mask[1:].sum())


def test_micro_batches_give_the_gradient_of_the_whole_batch(model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    rows = [chat_row(tokenizer, TRANSCRIPT[:2], TOOLS), chat_row(tokenizer, TRANSCRIPT, TOOLS)]
    # Both rows begin with the tools and the question: the update computes those tokens once.
    batch = collate([Trajectory("sft", None, 0.0, rows, [])])
    assert all(wave.plan is not None for micro in (1, 2) for wave in waves(batch, micro, share_prefixes=True))
    # The plain way: both rows right-padded in one forward, full logits at every position.
    width = max(len(row.token_ids) for row in rows)
    ids = torch.tensor([row.token_ids + [0] * (width - len(row.token_ids)) for row in rows])
    attention = torch.tensor([[1] * len(row.token_ids) + [0] * (width - len(row.token_ids)) for row in rows])
    mask = torch.tensor([row.loss_mask + [0] * (width - len(row.loss_mask)) for row in rows])[:, 1:]
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    picked = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -(picked * mask).sum() / mask.sum()
    reference = copy.deepcopy(model)
    loss.backward()
    for micro in (1, 2):
        trained = copy.deepcopy(reference)
        config = SFTConfig(micro_batch_size=micro, max_grad_norm=1e9)  # compare the unclipped gradient
        metrics = SFTUpdater(trained, config).step_rows(rows)
        assert metrics["loss"] == pytest.approx(float(loss.detach()), abs=1e-5)
        for before, after in zip(model.parameters(), trained.parameters(), strict=True):
            assert torch.allclose(before.grad, after.grad, atol=1e-6)


def test_bfloat16_computes_the_gradient_float32_gives_and_keeps_float32_weights(model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    rows = [chat_row(tokenizer, TRANSCRIPT, TOOLS)]
    gradients = {}
    for dtype in ("float32", "bfloat16"):
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        SFTUpdater(model, SFTConfig(max_grad_norm=1e9, compute_dtype=dtype)).step_rows(rows)
        gradients[dtype] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        assert all(p.dtype == torch.float32 for p in model.parameters())
    plain, bf16 = gradients["float32"], gradients["bfloat16"]
    assert not torch.equal(bf16, plain)  # it did compute in bfloat16
    assert float(torch.nn.functional.cosine_similarity(bf16, plain, dim=0)) > 0.99
    assert float(bf16.norm()) == pytest.approx(float(plain.norm()), rel=0.05)
    with pytest.raises(ConfigError, match="compute_dtype must be one of float32, bfloat16"):
        SFTConfig(compute_dtype="float16")


def test_rows_without_trained_tokens_are_refused(model_dir: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    with pytest.raises(ConfigError, match="loss mask 1"):
        SFTUpdater(model).step_rows(
            [TrajectoryRow(token_ids=[1, 2], loss_mask=[0, 0], sampled_logprobs=[0.0, 0.0])]
        )
    with pytest.raises(ConfigError, match="learning_rate"):
        SFTConfig(learning_rate=0)
    for norm in (0.0, -1.0):
        with pytest.raises(ConfigError, match="max_grad_norm"):
            SFTConfig(max_grad_norm=norm)
    with pytest.raises(ConfigError, match="at least one"):
        SFTUpdater(model).step_rows([])


def test_a_token_at_position_0_is_not_trained(model_dir: Path) -> None:
    """Nothing precedes it, so it has no logprob: it is neither trained nor counted."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    only_first = TrajectoryRow(token_ids=[5, 6], loss_mask=[1, 0], sampled_logprobs=[0.0, 0.0])
    with pytest.raises(ConfigError, match="loss mask 1"):
        SFTUpdater(model).step_rows([only_first])
    first_and_more = TrajectoryRow(token_ids=[5, 6, 7], loss_mask=[1, 1, 1], sampled_logprobs=[0.0] * 3)
    assert SFTUpdater(model).step_rows([first_and_more])["trained_tokens"] == 2.0
