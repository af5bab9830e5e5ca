"""Responses API <-> chat completions translation: requests, responses, stream events, refusals.

Every response and event is validated against the openai SDK's own pydantic models, so a shape the
SDK would not read fails here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from fulgor.gateway.errors import BadRequestError
from fulgor.gateway.responses_api import ResponsesStream, error_body, request_to_chat, response_from_chat

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
ADD_TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "strict": True,
}


def test_a_string_input_with_instructions_and_sampling_translates() -> None:
    chat = request_to_chat(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": "hi",
            "max_output_tokens": 9,
            "temperature": 0.2,
            "top_p": 0.9,
            "store": True,
            "include": [],
            "metadata": {"run": "1"},
            "stream": True,
        }
    )
    assert chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 9,
        "temperature": 0.2,
        "top_p": 0.9,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_items_with_a_function_call_round_trip_translate() -> None:
    chat = request_to_chat(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add 1"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Adding.", "annotations": []}],
                },
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "c1",
                    "name": "add",
                    "arguments": '{"a": 1}',
                },
                {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 2}'},
                {"type": "function_call_output", "call_id": "c1", "output": "1"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "2"}],
                },
            ],
            "tools": [ADD_TOOL],
            "tool_choice": {"type": "function", "name": "add"},
            "parallel_tool_calls": False,
        }
    )
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
    ]
    assert chat["messages"] == [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "add 1"},
        {"role": "assistant", "content": "Adding.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
    ]
    function = {"name": "add", "parameters": ADD_TOOL["parameters"], "description": "Add numbers."}
    assert chat["tools"] == [{"type": "function", "function": function}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["parallel_tool_calls"] is False


def test_a_function_call_without_text_before_it_is_an_assistant_turn_of_its_own() -> None:
    chat = request_to_chat(
        {
            "input": [
                {"role": "user", "content": "add"},
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
            ]
        }
    )
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
    }


@pytest.mark.parametrize(
    ("text", "response_format"),
    [
        ({"format": {"type": "text"}}, None),
        ({"format": None}, None),
        ({"verbosity": "low"}, None),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        (
            {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
            {
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
            },
        ),
    ],
)
def test_text_formats_become_response_formats(text: Any, response_format: Any) -> None:
    chat = request_to_chat({"input": "hi", "text": text})
    assert chat.get("response_format") == response_format


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id is not supported: .*send the full"),
        ({"conversation": "conv_1"}, "conversation is not supported: .*send the full"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt is not supported"),
        ({"background": True}, "background is not supported"),
        ({"tools": [{"type": "web_search"}]}, "tools of type 'web_search' are not supported: built-in"),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "'file_search'.*function tools only"),
        ({"tools": [{"type": "computer_use_preview"}]}, "'computer_use_preview'"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice must be"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format .* is not supported"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "'item_reference' are not supported"),
        ({"input": [{"id": "msg_1"}]}, "'item_reference' are not supported"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "'web_search_call' are not supported"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x"}]}]},
            "'input_image' are not supported: .*text only",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file'"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]}
                ]
            },
            "'input_audio' are not supported: .*text only",
        ),
    ],
)
def test_what_the_engines_cannot_serve_is_refused_naming_it(body: dict[str, Any], match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        request_to_chat({"model": "m", "input": "hi", **body})


@pytest.mark.parametrize(
    "body",
    [
        {"input": 3},
        {"input": ["hi"]},
        {"input": [{"role": "user", "content": ["hi"]}]},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]},
        {"input": [{"role": "user"}]},
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
        {"input": [{"type": "function_call_output", "call_id": 1, "output": "x"}]},
        {"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]},
        {"input": "hi", "instructions": ["x"]},
        {"input": "hi", "tools": "add"},
        {"input": "hi", "tools": [{"type": "function", "name": 1}]},
        {"input": "hi", "text": "json"},
    ],
)
def test_a_request_with_parts_of_the_wrong_type_is_a_bad_request(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError, match="must be"):
        request_to_chat({"model": "m", **body})


def test_a_request_without_input_is_a_bad_request() -> None:
    with pytest.raises(BadRequestError, match="needs 'input'"):
        request_to_chat({"model": "m"})


def test_an_unknown_role_is_a_bad_request() -> None:
    with pytest.raises(BadRequestError, match="role 'tool' is not"):
        request_to_chat({"input": [{"role": "tool", "content": "x"}]})


def chat_completion(message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "engine-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def test_a_chat_completion_with_tool_calls_becomes_a_response() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]
    chat = chat_completion({"role": "assistant", "content": "Adding.", "tool_calls": calls}, "tool_calls")
    request = {"model": "m", "input": "add 1", "instructions": "Add.", "tools": [ADD_TOOL]}
    response = Response.model_validate(response_from_chat(chat, request))
    assert (response.object, response.status, response.model) == ("response", "completed", "m")
    assert response.id.startswith("resp_")
    assert response.instructions == "Add."
    assert [item.type for item in response.output] == ["message", "function_call"]
    assert response.output_text == "Adding."
    call = response.output[1]
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.arguments, call.status) == ("c1", "add", '{"a": 1}', "completed")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (
        5,
        3,
        8,
    )
    assert response.incomplete_details is None
    assert response.tools[0].type == "function"


def test_a_length_stop_makes_the_response_incomplete() -> None:
    chat = chat_completion({"role": "assistant", "content": "Once upon"}, "length")
    response = Response.model_validate(response_from_chat(chat, {"input": "story", "max_output_tokens": 3}))
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message"
    assert response.output[0].status == "incomplete"
    assert response.max_output_tokens == 3


def test_a_tool_call_cut_by_the_length_limit_is_the_incomplete_item() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1'}}]
    chat = chat_completion({"role": "assistant", "content": "Adding.", "tool_calls": calls}, "length")
    response = Response.model_validate(response_from_chat(chat, {"input": "add", "tools": [ADD_TOOL]}))
    assert response.status == "incomplete"
    # The text before the call was finished; the call was being written when the limit hit.
    assert [(item.type, item.status) for item in response.output] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
    ]


def test_an_empty_answer_is_an_empty_message() -> None:
    chat = chat_completion({"role": "assistant", "content": None}, "stop")
    response = Response.model_validate(response_from_chat(chat, {"input": "x"}))
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == ""


def parse(events: list[bytes]) -> list[Any]:
    """Each event validated as the openai SDK's own model; its SSE event name matches its type."""
    parsed = []
    for raw in events:
        head, data = raw.decode().split("\n", 1)
        payload = json.loads(data.removeprefix("data: "))
        assert head == f"event: {payload['type']}"
        parsed.append(EVENTS.validate_python(payload))
    return parsed


def chunk(delta: dict[str, Any], finish: str | None = None, **top: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "model": "engine-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **top,
    }


def test_stream_events_follow_the_responses_sequence() -> None:
    stream = ResponsesStream({"model": "m", "input": "hi", "tools": [ADD_TOOL]})
    events = stream.events(chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2]))
    events += stream.events(chunk({"content": "Hi"}))
    events += stream.events(chunk({"content": " there"}))
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a"'}}
    events += stream.events(chunk({"tool_calls": [call]}))
    events += stream.events(
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "tool_calls")
    )
    events += stream.events({"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4}})
    events += stream.finish()
    parsed = parse(events)
    assert [event.type for event in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))
    assert parsed[0].response.status == "in_progress"
    assert parsed[0].response.output == []
    message_id = parsed[2].item.id
    assert {parsed[i].item_id for i in (3, 4, 5, 6, 7)} == {message_id}
    assert parsed[6].text == "Hi there"
    assert parsed[9].output_index == 1
    assert (parsed[9].item.call_id, parsed[9].item.name, parsed[9].item.arguments) == ("c1", "add", "")
    assert parsed[12].arguments == '{"a": 1}'
    final = parsed[-1].response
    assert final.id == parsed[0].response.id
    assert final.status == "completed"
    assert final.output_text == "Hi there"
    assert final.output[1].arguments == '{"a": 1}'
    assert final.usage.input_tokens == 2
    assert final.usage.output_tokens == 4


def test_a_stream_cut_by_the_length_limit_ends_incomplete() -> None:
    stream = ResponsesStream({"input": "story"})
    events = stream.events(chunk({"content": "Once"}))
    events += stream.events(chunk({}, "length"))
    events += stream.finish()
    parsed = parse(events)
    assert parsed[-1].type == "response.incomplete"
    assert parsed[-1].response.incomplete_details.reason == "max_output_tokens"
    assert parsed[-2].item.status == "incomplete"


def test_a_streamed_tool_call_cut_by_the_length_limit_is_incomplete() -> None:
    stream = ResponsesStream({"input": "add", "tools": [ADD_TOOL]})
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a"'}}
    events = stream.events(chunk({"content": "Adding."}))
    events += stream.events(chunk({"tool_calls": [call]}, "length"))
    events += stream.finish()
    parsed = parse(events)
    done = [event.item for event in parsed if event.type == "response.output_item.done"]
    assert [(item.type, item.status) for item in done] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
    ]
    assert parsed[-1].type == "response.incomplete"
    assert [item.status for item in parsed[-1].response.output] == ["completed", "incomplete"]


@pytest.mark.parametrize(
    "chunks",
    [[chunk({"content": "Hel"})], [chunk({"role": "assistant", "content": ""})], []],
    ids=["some-text", "no-text", "no-chunks"],
)
def test_a_stream_that_ends_without_a_finish_reason_ends_with_an_error_event(chunks: list[Any]) -> None:
    stream = ResponsesStream({"input": "hi"})
    events = [event for part in chunks for event in stream.events(part)] + stream.finish()
    parsed = parse(events)
    assert parsed[-1].type == "error"
    assert "ended before the answer finished" in parsed[-1].message
    assert not any(event.type.startswith("response.completed") for event in parsed)
    assert stream.error is not None
    assert stream.finish() == []


def test_a_stream_with_no_output_still_has_a_message() -> None:
    stream = ResponsesStream({"input": "x"})
    parsed = parse(stream.events(chunk({"role": "assistant", "content": ""}, "stop")) + stream.finish())
    assert [event.type for event in parsed][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_an_upstream_error_chunk_ends_the_stream_with_an_error_event() -> None:
    stream = ResponsesStream({"input": "hi"})
    events = stream.events(chunk({"content": "Hel"}))
    error = {"message": "generation failed inside the engine", "type": "server_error", "code": "engine"}
    events += stream.events({"error": error})
    events += stream.events(chunk({"content": "lo"}, "stop"))
    events += stream.finish()
    parsed = parse(events)
    assert [event.type for event in parsed][-2:] == ["response.output_text.delta", "error"]
    assert parsed[-1].message == "upstream: generation failed inside the engine"
    # The live API nests the error too; the openai SDK raises APIError on an "error" key.
    nested = json.loads(events[-1].decode().split("data: ", 1)[1])["error"]
    assert nested["message"] == "upstream: generation failed inside the engine"
    assert stream.error == "upstream: generation failed inside the engine"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "server_error"),
        (502, "server_error"),
    ],
)
def test_errors_take_the_openai_shape(status: int, kind: str) -> None:
    assert error_body(status, "boom", "some_code") == {
        "error": {"message": "boom", "type": kind, "param": None, "code": "some_code"}
    }
