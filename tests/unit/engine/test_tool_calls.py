"""Hermes-style tool-call parsing: valid calls become tool_calls, anything malformed stays content."""

from __future__ import annotations

import json

import pytest

from fulgor.engine.tool_calls import parse_tool_calls, tool_arguments_for_template


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
