"""The engine's errors: one subtree under :class:`fulgor.errors.FulgorError`.

Servers map these to HTTP statuses (see :mod:`fulgor.engine.app`); the errors themselves know
nothing about HTTP. A model directory that does not load raises the weights room's
:class:`fulgor.weights.errors.ModelLoadError`, which the engine's HTTP API maps beside these.
"""

from __future__ import annotations

from fulgor.errors import FulgorError
from fulgor.limits import quoted

__all__ = [
    "AdminAuthError",
    "AdminDisabledError",
    "ContextLengthError",
    "EngineError",
    "EngineUnavailableError",
    "InvalidRequestError",
    "UnknownModelError",
    "VLLMError",
]


class EngineError(FulgorError):
    """Base of the inference engines' errors."""

    code = "engine_error"


class InvalidRequestError(EngineError):
    """A request parameter is invalid or unsupported; the message names it."""

    code = "invalid_parameter"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnknownModelError(InvalidRequestError):
    """The request names a model this engine does not serve."""

    code = "model_not_found"

    def __init__(self, requested: str, served: str) -> None:
        super().__init__(
            f"model {quoted(requested)} is not served here; this engine serves {served!r} "
            "(see GET /v1/models)",
            param="model",
        )


class ContextLengthError(InvalidRequestError):
    """The prompt plus the requested completion does not fit the model's context window."""

    code = "context_length_exceeded"

    def __init__(
        self, max_model_len: int, prompt_tokens: int, max_tokens: int | None, *, at_least: bool = False
    ) -> None:
        if at_least:  # known from the prompt's size before it was tokenised
            detail = f"the prompt has at least {prompt_tokens} tokens"
        elif max_tokens is None:
            detail = f"the prompt alone has {prompt_tokens} tokens"
        else:
            detail = (
                f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens} "
                f"({prompt_tokens + max_tokens} in total)"
            )
        super().__init__(
            f"this model's maximum context length is {max_model_len} tokens, but {detail}; "
            "shorten the messages or lower max_tokens",
            param="messages",
        )
        self.max_model_len = max_model_len


class AdminAuthError(EngineError):
    """An admin request lacks the admin token, or admin endpoints are disabled."""

    code = "unauthorized"


class AdminDisabledError(AdminAuthError):
    """Admin endpoints were called on an engine started without an admin token."""

    code = "admin_disabled"


class EngineUnavailableError(EngineError):
    """The engine is stopped or failed; the message says why."""

    code = "engine_unavailable"


class VLLMError(EngineError):
    """The supervised vLLM server could not start, stay healthy or reload weights."""

    code = "vllm_error"
