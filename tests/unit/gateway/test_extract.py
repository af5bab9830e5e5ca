"""Token ids and logprobs from whole and streamed responses, in vLLM's layout."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fulgor.gateway.extract import BadEventError, SseParser, StreamAccumulator, choices_from_body


def sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


def test_chat_body_takes_prompt_ids_from_the_top_and_response_ids_from_each_choice() -> None:
    body = {
        "id": "c1",
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "model_version": 4,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
                "token_ids": [7, 8],
                "logprobs": {"content": [{"token": "h", "logprob": -0.5}, {"token": "i", "logprob": -0.25}]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    [choice] = choices_from_body("chat", body)
    assert choice.prompt_token_ids == [1, 2, 3]
    assert choice.response_token_ids == [7, 8]
    assert choice.response_logprobs == [-0.5, -0.25]
    assert choice.model_version == 4
    assert choice.response["message"]["content"] == "hi"
    assert choice.response["usage"]["completion_tokens"] == 2


def test_completion_body_takes_both_id_lists_from_each_choice() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "text": "a",
                "prompt_token_ids": [1],
                "token_ids": [2],
                "logprobs": {"token_logprobs": [-1.0]},
            },
            {"index": 1, "text": "b", "prompt_token_ids": [3], "token_ids": [4], "logprobs": None},
        ]
    }
    first, second = choices_from_body("completions", body)
    assert (first.prompt_token_ids, first.response_token_ids, first.response_logprobs) == ([1], [2], [-1.0])
    assert (second.prompt_token_ids, second.response_token_ids, second.response_logprobs) == ([3], [4], None)


def test_a_body_without_ids_leaves_them_none() -> None:
    [choice] = choices_from_body("chat", {"choices": [{"message": {"content": "x"}}]})
    assert choice.prompt_token_ids is None
    assert choice.response_token_ids is None


def test_sse_parser_joins_events_split_across_chunks() -> None:
    stream = sse({"a": 1}, {"b": 2})
    parser = SseParser()
    events = [event for i in range(0, len(stream), 7) for event in parser.feed(stream[i : i + 7])]
    assert events == [{"a": 1}, {"b": 2}]


def test_sse_parser_accepts_crlf_line_ends() -> None:
    assert SseParser().feed(b'data: {"a": 1}\r\n\r\n') == [{"a": 1}]


@pytest.mark.parametrize(
    ("data", "match"),
    [(b"[1, 2]", "not a JSON object: \\[1, 2\\]"), (b"7", "not a JSON object: 7"), (b"{nope", "not JSON")],
)
def test_sse_parser_refuses_an_event_that_is_not_a_json_object(data: bytes, match: str) -> None:
    with pytest.raises(BadEventError, match=match):
        SseParser().feed(b'data: {"a": 1}\n\ndata: ' + data + b"\n\n")


def test_a_streamed_chat_with_tool_calls_is_rebuilt_with_all_ids() -> None:
    accumulator = StreamAccumulator("chat")
    chunks: list[dict[str, Any]] = [
        {"id": "s", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"content": "He"}, "token_ids": [5], "logprobs": _lp(-0.1)}]},
        {"choices": [{"index": 0, "delta": {"content": "y"}, "token_ids": [6], "logprobs": _lp(-0.2)}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{"}}]
                    },
                    "token_ids": [9],
                    "logprobs": _lp(-0.3),
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]},
                    "token_ids": [10],
                    "logprobs": _lp(-0.4),
                    "finish_reason": "tool_calls",
                }
            ]
        },
        {"choices": [], "usage": {"completion_tokens": 4}},
    ]
    for chunk in chunks:
        accumulator.add(chunk)
    [record] = accumulator.records()
    assert record.prompt_token_ids == [1, 2]
    assert record.response_token_ids == [5, 6, 9, 10]
    assert record.response_logprobs == [-0.1, -0.2, -0.3, -0.4]
    message = record.response["message"]
    assert message["content"] == "Hey"
    assert message["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert record.response["finish_reason"] == "tool_calls"
    assert record.response["usage"] == {"completion_tokens": 4}


def _lp(value: float) -> dict[str, object]:
    return {"content": [{"token": "x", "logprob": value}]}
