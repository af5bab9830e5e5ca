"""Locally built models and tokenizers, loaded back through the same code as downloaded weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.engine_support import ADD_TOOL

from fulgor.engine.models import MODEL_SIZES, init_model
from fulgor.weights.errors import ModelLoadError
from fulgor.weights.loading import checkpoint_kind, load_model

TOOLS = [ADD_TOOL]


def test_init_model_writes_a_hugging_face_directory(tiny_model_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_model_dir / name).is_file(), name
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]) - 3  # specials counted twice
    assert config["vocab_size"] == vocab <= MODEL_SIZES["tiny"].vocab_size
    assert checkpoint_kind(tiny_model_dir) == "full"


def test_a_number_gets_the_same_ids_wherever_it_stands(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    number = tokenizer.encode("1776", add_special_tokens=False)
    for text in (" 1776", '"1776"', "\n1776\n", "Answer: 1776", "is 1776 or"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert any(ids[i : i + len(number)] == number for i in range(len(ids))), text
        assert tokenizer.decode(ids) == text


def test_numbers_are_cut_into_chunks_of_at_most_two_digits(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    for text, chunks in (
        ("4536", ["45", "36"]),
        ("493", ["49", "3"]),
        ("x1234567", ["x", "12", "34", "56", "7"]),
    ):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert [tokenizer.decode([i]) for i in ids] == chunks


def test_same_seed_same_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = init_model(tmp_path / "again", "tiny", seed=0)
    assert (again / "tokenizer.json").read_text() == (tiny_model_dir / "tokenizer.json").read_text()
    assert (again / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()


def test_a_task_corpus_makes_its_prompts_shorter(tmp_path: Path, tiny_model: Any) -> None:
    text = "A warehouse holds forty crates of oranges; the inventory tool counts them."
    out = init_model(tmp_path / "task", "tiny", seed=0, corpus=[text] * 200)
    loaded = load_model(out, device="cpu")
    fitted = len(loaded.tokenizer.encode(text, add_special_tokens=False))
    generic = len(tiny_model.tokenizer.encode(text, add_special_tokens=False))
    assert fitted < generic / 2
    assert loaded.tokenizer.decode(loaded.tokenizer.encode(text, add_special_tokens=False)) == text


def test_qwen2_architecture(tmp_path: Path) -> None:
    out = init_model(tmp_path / "qwen", "tiny", arch="qwen2", seed=1)
    loaded = load_model(out, device="cpu")
    assert loaded.model.config.model_type == "qwen2"


def test_init_refuses_a_directory_that_holds_a_model(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="already holds a model"):
        init_model(tiny_model_dir, "tiny")


def test_init_rejects_unknown_sizes(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="tiny"):
        init_model(tmp_path / "x", "huge")  # type: ignore[arg-type]


def test_loading_a_missing_directory_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="fulgor model init"):
        load_model(tmp_path / "nothing")


def test_special_tokens_and_tool_markers_are_single_tokens(tiny_model: Any) -> None:
    tokenizer = tiny_model.tokenizer
    for marker in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1, marker
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chat_template_renders_tools_calls_and_tool_results(tiny_model: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "6"},
    ]
    text = tiny_model.tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith('<|im_start|>system\nBe brief.\n<tools>\n{"name": "add", "description": "Add')
    assert "\n</tools><|im_end|>\n<|im_start|>user\nWhat is 2 + 3?" in text
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in text
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_template_without_tools_is_plain_chatml(tiny_model: Any) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    text = tiny_model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_is_a_llama_of_under_a_million_parameters_and_small_of_six_to_seven(
    tmp_path: Path, tiny_model: Any
) -> None:
    config = tiny_model.model.config
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads)
    assert shape == (128, 2, 8)
    assert sum(p.numel() for p in tiny_model.model.parameters()) < 1_000_000
    small = load_model(init_model(tmp_path / "small", "small", seed=0), device="cpu").model
    # 6.1M with the built-in corpus; a task corpus can fill the vocabulary up to about 7M.
    assert 6_000_000 <= sum(p.numel() for p in small.parameters()) <= 7_000_000
