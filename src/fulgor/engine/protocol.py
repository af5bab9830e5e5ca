"""Request bodies of the OpenAI-compatible API, with vLLM's extensions that training needs.

Fields the OpenAI SDK or agent frameworks commonly send but that do not change sampling (``user``,
``metadata``, ``store``, ``parallel_tool_calls``, ...) are accepted and ignored; parameters that would
change sampling and that the local engine does not implement are rejected with a message naming
them, never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fulgor.engine.sampling import MAX_TOP_LOGPROBS

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


class _Sampling(_Body):
    """Parameters shared by chat and text completions."""

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
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
    tool_choice: Literal["none", "auto"] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: dict[str, Any] | None = None
    return_tokens_as_token_ids: bool = False

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
