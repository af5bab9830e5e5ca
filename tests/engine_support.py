"""What the engine's unit and integration tests share: a tool definition, a wait for the
generation thread, and the check that a recorded call holds what the engine sampled."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fulgor.engine.local import LocalEngine
    from fulgor.types import ModelCall

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}


async def until(condition: Callable[[], bool], timeout_seconds: float = 30.0) -> None:
    """Wait for a state change on the engine's generation thread, which offers no event to await."""
    for _ in range(int(timeout_seconds / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")


def assert_sampled_by(engine: LocalEngine, call: ModelCall) -> None:
    """The recorded logprobs are the engine's model's own for exactly the recorded ids (which
    re-tokenised text would not give)."""
    assert_logprobs_of(engine.model.model, call)


def assert_logprobs_of(model: Any, call: ModelCall) -> None:
    """The recorded logprobs are ``model``'s (a transformers causal LM) for exactly the recorded ids."""
    import torch

    assert not call.token_ids_missing
    assert call.prompt_token_ids
    assert call.response_token_ids
    assert call.response_logprobs
    prompt, output = call.prompt_token_ids, call.response_token_ids
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1].gather(
        -1, torch.tensor(output)[:, None]
    )
    assert torch.allclose(torch.tensor(call.response_logprobs), expected.squeeze(-1), atol=1e-3)
