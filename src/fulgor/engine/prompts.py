"""Turning requests into prompt token ids: the model's chat template for chat, the tokenizer for text.

Chat prompts are rendered to text by the model's own template and then encoded without adding
special tokens again (the template already wrote them), as vLLM does, so a prompt gets the same ids
from fulgor's engine and from vLLM.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from fulgor.engine.chat_format import ChatFormat
from fulgor.engine.errors import ContextLengthError, InvalidRequestError
from fulgor.engine.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest

__all__ = ["chat_prompt_ids", "completion_prompt_ids", "fewest_tokens", "render_chat_ids"]


def _template_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = dict(message.model_extra or {})
    # Templates know "system"; the OpenAI API's newer "developer" role means the same.
    rendered["role"] = "system" if message.role == "developer" else message.role
    rendered["content"] = message.content
    if message.tool_calls:
        rendered["tool_calls"] = list(message.tool_calls)
    return rendered


def chat_prompt_ids(
    tokenizer: Any,
    request: ChatCompletionRequest,
    chat_format: ChatFormat | None = None,
    max_model_len: int | None = None,
) -> list[int]:
    """Render ``request.messages`` (and ``tools``) with the chat template and encode them."""
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
    return render_chat_ids(
        tokenizer, request.messages, tools, chat_format=chat_format, max_model_len=max_model_len
    )


def render_chat_ids(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    chat_format: ChatFormat | None = None,
    max_model_len: int | None = None,
) -> list[int]:
    """The ids the engine serves ``messages`` with: normalised and rendered by ``chat_format`` (the
    tokenizer's own template when None), then encoded as the text stands.

    Without ``add_generation_prompt`` the last turn is rendered as finished (training rows). With
    ``max_model_len``, text that cannot fit is refused before it is tokenised.
    """
    chat_format = chat_format or ChatFormat.own(tokenizer)
    rendered = [_template_message(m) for m in messages]
    text = chat_format.render(tokenizer, rendered, tools, add_generation_prompt=add_generation_prompt)
    _refuse_beyond_context(tokenizer, text, max_model_len)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def fewest_tokens(tokenizer: Any, text: str) -> int:
    """The fewest tokens ``text`` can encode to: its UTF-8 bytes over the longest token's, so that a
    prompt far beyond the context is refused without tokenising it (which, for megabytes of text,
    would hold the server's event loop for seconds)."""
    longest = _LONGEST.get(tokenizer)
    if longest is None:
        vocabulary = tokenizer.get_vocab()
        longest = _LONGEST[tokenizer] = max((len(token.encode("utf-8")) for token in vocabulary), default=1)
    return len(text.encode("utf-8")) // max(longest, 1)


def _refuse_beyond_context(tokenizer: Any, text: str, max_model_len: int | None) -> None:
    """A ContextLengthError, before tokenising, for text that cannot fit ``max_model_len`` tokens."""
    if max_model_len is not None:
        least = fewest_tokens(tokenizer, text)
        if least > max_model_len:
            raise ContextLengthError(max_model_len, least, None, at_least=True)


def completion_prompt_ids(
    tokenizer: Any, request: CompletionRequest, max_model_len: int | None = None
) -> list[list[int]]:
    """One list of ids per prompt: text is encoded, token ids are checked against the vocabulary."""
    prompt = request.prompt
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif all(isinstance(item, int) for item in prompt):
        prompts = [[int(item) for item in prompt if isinstance(item, int)]]
    else:
        prompts = [item for item in prompt if isinstance(item, str | list)]
    vocab_size = len(tokenizer)
    result = []
    for item in prompts:
        if isinstance(item, str):
            _refuse_beyond_context(tokenizer, item, max_model_len)
        ids = tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else list(item)
        if not ids:
            raise InvalidRequestError("the prompt is empty; send at least one token", param="prompt")
        if any(i < 0 or i >= vocab_size for i in ids):
            raise InvalidRequestError(f"prompt token ids must lie in [0, {vocab_size})", param="prompt")
        result.append(ids)
    return result
