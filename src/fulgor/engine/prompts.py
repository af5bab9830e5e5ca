"""Turning requests into prompt token ids: the model's chat template for chat, the tokenizer for text.

Chat prompts are rendered to text by the model's own template and then encoded without adding
special tokens again (the template already wrote them), as vLLM does, so a prompt gets the same ids
from fulgor's engine and from vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fulgor.engine.errors import InvalidRequestError
from fulgor.engine.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from fulgor.engine.tool_calls import tool_arguments_for_template

__all__ = ["chat_prompt_ids", "completion_prompt_ids", "render_chat_ids"]


def _template_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = dict(message.model_extra or {})
    # Templates know "system"; the OpenAI API's newer "developer" role means the same.
    rendered["role"] = "system" if message.role == "developer" else message.role
    rendered["content"] = message.content
    if message.tool_calls:
        rendered["tool_calls"] = [_template_tool_call(call) for call in message.tool_calls]
    return rendered


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if "name" not in function:
        raise InvalidRequestError("every assistant tool call needs function.name", param="messages")
    function["arguments"] = tool_arguments_for_template(function.get("arguments", {}))
    return {**call, "function": function}


def chat_prompt_ids(tokenizer: Any, request: ChatCompletionRequest) -> list[int]:
    """Render ``request.messages`` (and ``tools``) with the chat template and encode them."""
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
    return render_chat_ids(tokenizer, request.messages, tools)


def render_chat_ids(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The ids the engine serves ``messages`` with: template to text, then encoded as it stands.

    Without ``add_generation_prompt`` the last turn is rendered as finished (training rows).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError(
            "this model has no chat template; use /v1/completions, "
            "or add a chat_template to its tokenizer files"
        )
    rendered = [_template_message(m) for m in messages]
    try:
        text = tokenizer.apply_chat_template(
            rendered, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
    except Exception as exc:  # template errors come from Jinja and the template's own raise_exception
        raise InvalidRequestError(
            f"the chat template rejected the messages: {exc}", param="messages"
        ) from exc
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def completion_prompt_ids(tokenizer: Any, request: CompletionRequest) -> list[list[int]]:
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
        ids = tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else list(item)
        if not ids:
            raise InvalidRequestError("the prompt is empty; send at least one token", param="prompt")
        if any(i < 0 or i >= vocab_size for i in ids):
            raise InvalidRequestError(f"prompt token ids must lie in [0, {vocab_size})", param="prompt")
        result.append(ids)
    return result
