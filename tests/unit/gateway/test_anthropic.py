"""Messages API <-> chat completions translation, error shapes, stop sequences."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fulgor.gateway.anthropic import AnthropicStream, error_body, message_from_chat, request_to_chat
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


@pytest.mark.parametrize(
    "body",
    [
        {"messages": ["hi"]},
        {"messages": [{"role": "user", "content": ["hi"]}]},
        {"messages": [{"role": "assistant", "content": [1]}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": ["x"]}]}
            ]
        },
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": ["x"]},
        {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"},
        {"messages": [{"role": "user", "content": "hi"}], "stop_sequences": "END"},
        {"messages": [{"role": "user", "content": "hi"}], "system": 7},
    ],
)
def test_a_request_with_parts_of_the_wrong_type_is_a_bad_request(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError, match="must be"):
        request_to_chat({"model": "m", "max_tokens": 5, **body})


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_errors_take_the_anthropic_type_of_their_status(status: int, kind: str) -> None:
    assert error_body(status, "boom") == {"type": "error", "error": {"type": kind, "message": "boom"}}


def test_an_upstream_error_chunk_ends_the_stream_with_an_error_event() -> None:
    stream = AnthropicStream("m")
    events = stream.events({"id": "x", "choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    error = {"message": "generation failed inside the engine", "type": "server_error", "code": "engine"}
    events += stream.events({"error": error})
    events += stream.events({"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]})
    events += stream.finish()
    parsed = [json.loads(e.decode().split("data: ", 1)[1]) for e in events]
    assert [p["type"] for p in parsed] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert parsed[-1]["error"] == {
        "type": "api_error",
        "message": "upstream: generation failed inside the engine",
    }
    assert events[-1].startswith(b"event: error\n")
    assert stream.error == "upstream: generation failed inside the engine"


@pytest.mark.parametrize(
    "chunks",
    [[{"id": "x", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}], []],
    ids=["some-text", "no-chunks"],
)
def test_a_stream_that_ends_without_a_finish_reason_ends_with_an_error_event(chunks: list[Any]) -> None:
    stream = AnthropicStream("m")
    events = [event for part in chunks for event in stream.events(part)] + stream.finish()
    parsed = [json.loads(e.decode().split("data: ", 1)[1]) for e in events]
    assert parsed[-1]["type"] == "error"
    assert "ended before the answer finished" in parsed[-1]["error"]["message"]
    assert "message_stop" not in [p["type"] for p in parsed]
    assert stream.error is not None


def test_a_matched_stop_sequence_is_reported_whole_and_streamed() -> None:
    chat = {"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "stop_reason": "END"}]}
    message = message_from_chat(chat, "m", ["END", "STOP"])
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    # A stop token id (vLLM gives an int) or a string the request did not ask for is an end_turn.
    for other in (2, "eos"):
        chat["choices"][0]["stop_reason"] = other
        assert message_from_chat(chat, "m", ["END"])["stop_reason"] == "end_turn"
    stream = AnthropicStream("m", ["END"])
    stream.events({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    stream.events({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]})
    delta = json.loads(stream.finish()[-2].decode().split("data: ", 1)[1])["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert request_to_chat({"messages": [], "stop_sequences": ["END"]})["stop"] == ["END"]
