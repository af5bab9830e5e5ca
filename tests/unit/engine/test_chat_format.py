"""Chat formats on real tokenizers and templates: SmolLM2 (from its GGUF file), Llama 3.1, Qwen3 and
Gemma 3. Each family's template is detected or named, a tool conversation renders, the family's
own call format parses, and the next turn's prompt extends the ids of the turn before (a token row
the trainer can keep appending to) or does not, counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.real_models import SMOLLM2_GGUF, fetched, tokenizer_dir

from fulgor.engine.chat_format import (
    SHIPPED_TEMPLATES,
    ChatFormat,
    detect_reasoning_parser,
    detect_tool_parser,
    model_chat_template,
    read_chat_template,
    write_tool_calls,
)
from fulgor.engine.errors import InvalidRequestError
from fulgor.errors import ConfigError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
QUESTION = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 2 + 3?"},
]
# family: (tokenizer source, template fulgor serves it with (None: its own), tool parser, reasoning)
FAMILIES = {
    "smollm2": ("gguf", "chatml-tools", "hermes", None),
    "llama3_1": ("llama3_1", "llama3-json-tools", "llama3_json", None),
    "qwen3": ("qwen3", None, "hermes", "qwen3"),
    "gemma3": ("gemma3", "gemma3-pythonic-tools", "pythonic", None),
}

_loaded: dict[str, Any] = {}


def tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    if source not in _loaded:
        if source == "gguf":
            gguf = fetched(SMOLLM2_GGUF)
            pytest.importorskip("gguf")
            _loaded[source] = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        else:
            _loaded[source] = AutoTokenizer.from_pretrained(tokenizer_dir(source))
    return _loaded[source]


def family_format(family: str) -> tuple[Any, ChatFormat]:
    source, template, _, _ = FAMILIES[family]
    tok = tokenizer(source)
    return tok, ChatFormat.of(tok, read_chat_template(template) if template else None)


def shared_prefix(first: list[int], second: list[int]) -> int:
    size = 0
    while size < min(len(first), len(second)) and first[size] == second[size]:
        size += 1
    return size


def tool_turn(chat_format: ChatFormat, tok: Any, answer: str) -> tuple[list[int], list[int], Any]:
    """The prompt of a question with tools plus ``answer``'s ids, the prompt of the next turn
    (the parsed call sent back as the agent's SDK does, and its result), and the parsed answer."""
    first = chat_format.render(tok, QUESTION, TOOLS)
    parsed = chat_format.parse(answer, tools_active=True)
    turn: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content,
        "tool_calls": [call.to_openai() for call in parsed.tool_calls],
    }
    if parsed.reasoning_content is not None:
        turn["reasoning_content"] = parsed.reasoning_content
    result = {"role": "tool", "tool_call_id": parsed.tool_calls[0].id, "content": "5"}
    second = chat_format.render(tok, [*QUESTION, turn, result], TOOLS)
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    return encode(first + answer), encode(second), parsed


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tool_conversation_in_each_familys_own_format(family: str) -> None:
    tok, chat_format = family_format(family)
    _, _, parser, reasoning = FAMILIES[family]
    assert (chat_format.tool_parser, chat_format.reasoning_parser) == (parser, reasoning)
    assert chat_format.renders_tools
    assert "calculator" in chat_format.render(tok, QUESTION, TOOLS)

    answer = write_tool_calls(
        parser, [{"function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}]
    )
    if reasoning:
        answer = "<think>\nTwo plus three.\n</think>\n\n" + answer
    before, after, parsed = tool_turn(chat_format, tok, answer)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("calculator", {"expression": "2 + 3"})
    ]
    assert parsed.reasoning_content == ("Two plus three." if reasoning else None)
    # Append-only: the next turn's prompt starts with every id of this one's prompt and answer.
    assert after[: len(before)] == before
    assert "5" in tok.decode(after[len(before) :])


def test_qwen3s_template_drops_earlier_thinking_unless_it_is_sent_back() -> None:
    tok, chat_format = family_format("qwen3")
    call = '{"name": "calculator", "arguments": {"expression": "2 + 3"}}'
    answer = f"<think>\nTwo plus three.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"
    before, after, parsed = tool_turn(chat_format, tok, answer)
    assert after[: len(before)] == before  # reasoning_content sent back: the row goes on

    # An agent that sends back only content and tool calls (most do) gets a prompt without the
    # thinking: the ids part from the sampled ones where the <think> block was.
    turn = {"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in parsed.tool_calls]}
    result = {"role": "tool", "tool_call_id": "call_0", "content": "5"}
    dropped = tok.encode(chat_format.render(tok, [*QUESTION, turn, result], TOOLS), add_special_tokens=False)
    breaks_at = shared_prefix(before, dropped)
    assert breaks_at < len(before)
    assert tok.decode(before[breaks_at:]).startswith("<think>")


def test_smollm2s_own_template_leaves_tools_out_and_the_request_is_refused() -> None:
    tok = tokenizer("gguf")
    own = ChatFormat.of(tok)
    assert own.template == tok.chat_template
    assert not own.renders_tools
    with pytest.raises(InvalidRequestError, match="chatml-tools") as refused:
        own.render(tok, QUESTION, TOOLS)
    assert refused.value.param == "tools"

    # Its history still renders: calls written into the content as hermes blocks, results as
    # <tool_response> user turns (the template knows no tool role), content None as "".
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
    }
    history = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "6"},
    ]
    text = own.render(tok, history, None)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}'
        "\n</tool_call>" in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response>" in text
    )
    assert "<|im_start|>tool" not in text


def test_llama_31s_packaged_template_leaves_tools_out() -> None:
    tok = tokenizer("llama3_1")
    own = ChatFormat.of(tok)
    assert not own.renders_tools
    assert "leaves tool definitions out" in own.tool_support
    with pytest.raises(InvalidRequestError, match="llama3-json-tools"):
        own.render(tok, QUESTION, TOOLS)


def test_parsers_are_detected_from_templates() -> None:
    assert detect_tool_parser(SHIPPED_TEMPLATES["chatml-tools"]) == "hermes"
    assert detect_tool_parser(SHIPPED_TEMPLATES["llama3-json-tools"]) == "llama3_json"
    assert detect_tool_parser(SHIPPED_TEMPLATES["gemma3-pythonic-tools"]) == "pythonic"
    assert detect_tool_parser("{{ '[TOOL_CALLS]' + calls }}") == "mistral"
    assert detect_tool_parser("{{ '<|python_tag|>' }}") == "llama3_json"
    assert detect_tool_parser("{{ messages }}") is None
    assert detect_tool_parser(None) is None
    assert detect_reasoning_parser("{{ '</think>' }}{% if add_generation_prompt %}x{% endif %}") == "qwen3"
    assert detect_reasoning_parser("</think>{% if add_generation_prompt %}{{ '<think>\\n' }}{% endif %}") == (
        "deepseek_r1"
    )
    assert detect_reasoning_parser("{{ messages }}") is None


def test_named_parsers_win_over_detection_and_unknown_names_are_refused() -> None:
    tok = tokenizer("qwen3")
    named = ChatFormat.of(tok, None, "pythonic", "deepseek_r1")
    assert (named.tool_parser, named.reasoning_parser) == ("pythonic", "deepseek_r1")
    with pytest.raises(ConfigError, match="hermes, llama3_json, mistral, pythonic"):
        ChatFormat.of(tok, None, "nope")


def test_templates_from_files_and_by_name(tmp_path: Path) -> None:
    assert read_chat_template("chatml-tools") == SHIPPED_TEMPLATES["chatml-tools"]
    good = tmp_path / "t.jinja"
    good.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert read_chat_template(str(good)) == good.read_text()
    with pytest.raises(ConfigError, match="no such file, and not a template fulgor ships"):
        read_chat_template(str(tmp_path / "missing.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("line one\n{% for m in messages %}{{ m.content }}")
    with pytest.raises(ConfigError, match=r"does not parse: line \d+"):
        read_chat_template(str(broken))


def test_a_model_directorys_template_is_read_from_its_files(tmp_path: Path) -> None:
    assert model_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]}
        )
    )
    assert model_chat_template(tmp_path) == "A"
    (tmp_path / "chat_template.jinja").write_text("C")
    assert model_chat_template(tmp_path) == "C"
