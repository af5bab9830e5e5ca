"""Tool-call parsing in each family's format (vLLM's parser names): valid calls become tool_calls,
anything malformed stays content; reasoning comes apart from the content."""

from __future__ import annotations

import json

import pytest

from fulgor.engine.reasoning import REASONING_PARSERS, reasoning_parser
from fulgor.engine.tool_calls import TOOL_PARSERS, parse_tool_calls, tool_arguments_for_template, tool_parser
from fulgor.errors import ConfigError


def test_plain_text_is_content() -> None:
    parsed = parse_tool_calls("The answer is 5.")
    assert parsed.content == "The answer is 5."
    assert parsed.tool_calls == []


def test_one_call_is_parsed_with_arguments_as_json_string() -> None:
    parsed = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
    assert parsed.content is None
    assert len(parsed.tool_calls) == 1
    call = parsed.tool_calls[0].to_openai()
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}


def test_several_calls_and_surrounding_text() -> None:
    text = (
        "Let me compute.\n"
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
        '<tool_call>{"name": "multiply", "arguments": "{\\"x\\": 4}"}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me compute."
    assert [c.name for c in parsed.tool_calls] == ["add", "multiply"]
    assert json.loads(parsed.tool_calls[1].arguments) == {"x": 4}
    assert parsed.tool_calls[0].id != parsed.tool_calls[1].id


def test_missing_arguments_mean_an_empty_object() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>')
    assert json.loads(parsed.tool_calls[0].arguments) == {}


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>',  # broken JSON
        '<tool_call>{"name": "add", "arguments": {"a": 2}}',  # never closed
        '<tool_call>["add", 2]</tool_call>',  # not an object
        '<tool_call>{"arguments": {"a": 2}}</tool_call>',  # no name
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',  # empty name
        '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "add", "arguments": "not json"}</tool_call>',  # string arguments, not JSON
        # one bad call of two
        '<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{bad}</tool_call>',
        '</tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>',  # stray closing tag
        "<tool_call></tool_call>",
    ],
)
def test_malformed_calls_come_back_as_plain_content(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == []
    assert parsed.content == text


def test_template_arguments_become_mappings_when_they_are_json_objects() -> None:
    assert tool_arguments_for_template('{"a": 1}') == {"a": 1}
    assert tool_arguments_for_template({"a": 1}) == {"a": 1}
    assert tool_arguments_for_template("[1, 2]") == "[1, 2]"
    assert tool_arguments_for_template("oops {") == "oops {"


def calls_of(parser: str, text: str) -> tuple[str | None, list[tuple[str, dict[str, object]]]]:
    parsed = tool_parser(parser)(text)
    return parsed.content, [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls]


def test_a_hermes_block_may_hold_a_list_of_calls_as_smollm2_writes_them() -> None:
    text = '<tool_call>[{"name": "add", "arguments": {"a": 1}}, {"name": "now", "arguments": {}}]</tool_call>'
    assert calls_of("hermes", text) == (None, [("add", {"a": 1}), ("now", {})])
    assert calls_of("hermes", "<tool_call>[]</tool_call>") == ("<tool_call>[]</tool_call>", [])


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('{"name": "add", "parameters": {"a": 1}}', None, [("add", {"a": 1})]),
        ('<|python_tag|>{"name": "add", "arguments": {"a": 1}}', None, [("add", {"a": 1})]),
        (
            'Sure.<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "now", "parameters": {}}',
            "Sure.",
            [("add", {"a": 1}), ("now", {})],
        ),
        ("The answer is 5.", "The answer is 5.", []),
        ('{"name": "add", "parameters": {"a": 1}} and more', None, None),  # trailing text: not a call
        ('{"name": "add"', None, None),  # broken JSON
        ('{"parameters": {}}', None, None),  # no name
    ],
)
def test_llama3_json_calls(text: str, content: str | None, calls: list[tuple[str, object]] | None) -> None:
    if calls is None:  # stays plain content
        assert calls_of("llama3_json", text) == (text, [])
    else:
        assert calls_of("llama3_json", text) == (content, calls)


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        (
            '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "now", "arguments": {}}]',
            [("add", {"a": 1}), ("now", {})],
        ),
        ('[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]now[ARGS]{}', [("add", {"a": 1}), ("now", {})]),
        ('[TOOL_CALLS]add[CALL_ID]abc123456[ARGS]{"a": 1}', [("add", {"a": 1})]),
        ("[TOOL_CALLS]add", None),
        ('[TOOL_CALLS][{"name": "add", "arguments": 3}]', None),
    ],
)
def test_mistral_calls(text: str, calls: list[tuple[str, object]] | None) -> None:
    assert calls_of("mistral", text) == ((None, calls) if calls is not None else (text, []))


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("[add(a=1, b=-2), now()]", [("add", {"a": 1, "b": -2}), ("now", {})]),
        (
            '<|python_start|>[search(query="x", tags=["a"], exact=true, limit=None)]<|python_end|>',
            [("search", {"query": "x", "tags": ["a"], "exact": True, "limit": None})],
        ),
        ('[f(options={"k": False})]', [("f", {"options": {"k": False}})]),
        ("[add(1, 2)]", None),  # positional arguments have no names
        ("[add(a=x)]", None),  # a variable
        ("[add(**kw)]", None),
        ("[1, 2]", None),
        ("The list is [add(a=1)].", None),
        ("[add(a={1, 2})]", None),  # a set is no JSON value
    ],
)
def test_pythonic_calls(text: str, calls: list[tuple[str, object]] | None) -> None:
    assert calls_of("pythonic", text) == ((None, calls) if calls is not None else (text, []))


def test_an_unknown_parser_is_an_error_listing_the_known_ones() -> None:
    assert set(TOOL_PARSERS) >= {"hermes", "llama3_json", "mistral", "pythonic"}
    with pytest.raises(ConfigError, match="hermes, llama3_json, mistral, pythonic"):
        tool_parser("granite")
    with pytest.raises(ConfigError, match="deepseek_r1, qwen3"):
        reasoning_parser("gptoss")


@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "rest"),
    [
        ("qwen3", "<think>\nadd them\n</think>\n\nIt is 5.", "add them", "It is 5."),
        ("qwen3", "add them\n</think>\n\nIt is 5.", "add them", "It is 5."),  # <think> in the prompt
        ("qwen3", "It is 5.", None, "It is 5."),  # no thinking at all
        ("deepseek_r1", "add them\n</think>It is 5.", "add them", "It is 5."),
        ("deepseek_r1", "still thinking", "still thinking", ""),  # cut off while thinking
        ("qwen3", "<think></think>\n\nIt is 5.", None, "It is 5."),
    ],
)
def test_reasoning_comes_apart_from_the_content(
    parser: str, text: str, reasoning: str | None, rest: str
) -> None:
    assert set(REASONING_PARSERS) == {"qwen3", "deepseek_r1"}
    assert reasoning_parser(parser)(text) == (reasoning, rest)
