"""Answers of a model whose template thinks (Qwen3's, on its real tokenizer): the reasoning comes back
apart as ``reasoning_content``, whole and streamed (a stream holds the text back to the end)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.real_models import tokenizer_dir

from fulgor.engine.chat_format import ChatFormat
from fulgor.engine.output import ResponseContext, chat_choice
from fulgor.engine.protocol import ChatCompletionRequest
from fulgor.engine.scheduler import FinishEvent, TokenEvent
from fulgor.engine.streaming import _ChatChunks

CALL = '{"name": "add", "arguments": {"a": 2, "b": 3}}'
ANSWER = f"<think>\nTwo plus three.\n</think>\n\n<tool_call>\n{CALL}\n</tool_call>"


@pytest.fixture(scope="module")
def context() -> ResponseContext:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen3"))
    return ResponseContext(tokenizer, "qwen3", "chat", chat_format=ChatFormat.of(tokenizer))


def finished(text: str) -> FinishEvent:
    return FinishEvent("stop", text, [1, 2], [-0.1, -0.2], [[], []], 0)


def test_a_whole_answer_carries_its_reasoning_apart(context: ResponseContext) -> None:
    choice = chat_choice(
        context, 0, finished(ANSWER), tools_active=True, logprobs=False, return_token_ids=False
    )
    message = choice["message"]
    assert message["reasoning_content"] == "Two plus three."
    assert message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert choice["finish_reason"] == "tool_calls"

    plain = chat_choice(
        context, 0, finished("It is 5."), tools_active=False, logprobs=False, return_token_ids=False
    )
    assert plain["message"] == {"role": "assistant", "content": "It is 5."}


def test_a_stream_holds_the_text_and_ends_with_reasoning_and_content(context: ResponseContext) -> None:
    body = ChatCompletionRequest.model_validate(
        {"model": "qwen3", "messages": [{"role": "user", "content": "2 + 3?"}], "stream": True}
    )
    chunks = _ChatChunks(context, body, [0])
    chunks.opening(0, 0)
    assert chunks.token(0, TokenEvent(1, -0.1, [], "<think>", 0)) == []  # nothing shown before the end
    [last] = chunks.finish(0, finished("<think>\nTwo plus three.\n</think>\n\nIt is 5."))
    payload: dict[str, Any] = json.loads(last.removeprefix("data: "))
    assert payload["choices"][0]["delta"] == {"reasoning_content": "Two plus three.", "content": "It is 5."}
