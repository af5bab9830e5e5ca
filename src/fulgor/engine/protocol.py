"""Request bodies of the OpenAI-compatible API, with vLLM's extensions that training needs.

Fields the OpenAI SDK or agent frameworks commonly send but that do not change sampling (``user``,
``metadata``, ``store``, ``parallel_tool_calls``, ...) are accepted and ignored; parameters and
content that would change the output and that the local engine does not implement (penalties,
``logit_bias``, image or audio content parts, a forced ``tool_choice``) are rejected with a message
naming them, never silently ignored.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fulgor.engine.sampling import MAX_TOP_LOGPROBS
from fulgor.limits import quoted

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "StreamOptions",
    "Tool",
    "WeightSwapRequest",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatMessage(BaseModel):
    """One message; extra keys (``name``, ``tool_call_id``, ...) travel to the chat template."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        for part in content if isinstance(content, list) else ():
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"content parts of type {quoted(part.get('type'))} are not supported: this engine takes "
                    "text only; send the content as a string or as parts "
                    '{"type": "text", "text": "..."}'
                )
        return content


class _Sampling(_Body):
    """Parameters shared by chat and text completions."""

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    # torch seeds are 64-bit and choice i samples with seed + i: a larger seed would overflow there.
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1 - 128)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    ignore_eos: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    @model_validator(mode="after")
    def _supported(self) -> _Sampling:
        if self.frequency_penalty or self.presence_penalty:
            raise ValueError(
                "frequency_penalty and presence_penalty are not supported by this engine; omit them"
            )
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this engine; omit it")
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ValueError("stop takes at most 16 strings")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage_in_stream(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: dict[str, Any] | None = None
    return_tokens_as_token_ids: bool = False

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_supported(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        # "required" and a named function promise a call; vLLM keeps that promise with guided decoding
        # of the tool's JSON schema, which this engine does not have, and prompting alone cannot.
        if value is None or value in ("auto", "none"):
            return value
        shown = quoted(json.dumps(value), bare=True)
        raise ValueError(
            f'{shown} is not supported: this engine takes tool_choice "auto" (the '
            'default: the model decides whether to call a tool) or "none" (the output is text only); '
            'it cannot guarantee a tool call ("required") or a call to a named function, which takes '
            'constrained decoding. Send "auto" and name the tool to call in the prompt, or serve the '
            "model with `fulgor engine --backend vllm`, which supports both"
        )

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ValueError("response_format other than 'text' is not supported by this engine; omit it")
        return self

    @property
    def max_output_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def tools_active(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: a prompt as text, token ids, or a list of either."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported by this engine; omit it")
        if self.suffix:
            raise ValueError("suffix is not supported by this engine; omit it")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self


class WeightSwapRequest(BaseModel):
    """``POST /admin/weights``: serve the checkpoint at ``path`` as the next model version."""

    model_config = ConfigDict(extra="forbid")

    path: Annotated[str, Field(min_length=1)]
    model: str | None = None
    """Which served model gets the weights (a LoRA adapter's name); the engine's own when unset."""
