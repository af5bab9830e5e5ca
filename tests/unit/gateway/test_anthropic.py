"""Messages API <-> chat completions translation."""

from __future__ import annotations

import json

import pytest

from fulgor.gateway.anthropic import AnthropicStream, message_from_chat, request_to_chat
from fulgor.gateway.errors import BadRequestError


def test_a_request_with_system_tools_and_tool_results_translates() -> None:
    chat = request_to_chat(
        {
            "model": "m",
            "max_tokens": 10,
            "system": [{"type": "text", "text": "Be brief."}],
            "temperature": 0.2,
            "stop_sequences": ["END"],
            "tools": [{"name": "add", "description": "Add.", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": "add 1 and 2"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Sure."},
                        {"type": "tool_use", "id": "tu1", "name": "add", "input": {"a": 1, "b": 2}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "tu1",
                            "content": [{"type": "text", "text": "3"}],
                        },
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
        }
    )
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat["messages"][2]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 1, "b": 2}',
    }
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "tu1", "content": "3"}
    assert chat["messages"][4] == {"role": "user", "content": "thanks"}
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert chat["tool_choice"] == "required"
    assert (chat["max_tokens"], chat["temperature"], chat["stop"]) == (10, 0.2, ["END"])


def test_images_are_refused_with_a_clear_error() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(BadRequestError, match="not supported"):
        request_to_chat({"messages": [{"role": "user", "content": [image]}]})


def test_a_chat_completion_becomes_a_message_with_tool_use() -> None:
    chat = {
        "id": "x",
        "choices": [
            {
                "message": {
                    "content": "Adding.",
                    "tool_calls": [{"id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }
    message = message_from_chat(chat, "m")
    assert message["content"] == [
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 5, "output_tokens": 3}


def test_stream_events_follow_the_messages_sequence() -> None:
    stream = AnthropicStream("m")
    events = stream.events({"id": "s", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {}}]})
    events += stream.events({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a"'}}
    events += stream.events({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    more = {"index": 0, "function": {"arguments": ": 1}"}}
    events += stream.events(
        {"choices": [{"index": 0, "delta": {"tool_calls": [more]}, "finish_reason": "tool_calls"}]}
    )
    events += stream.finish()
    parsed = [json.loads(e.decode().split("data: ", 1)[1]) for e in events]
    assert [p["type"] for p in parsed] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert parsed[0]["message"]["usage"]["input_tokens"] == 2
    assert parsed[4]["content_block"] == {"type": "tool_use", "id": "c", "name": "f", "input": {}}
    assert parsed[8]["delta"]["stop_reason"] == "tool_use"
