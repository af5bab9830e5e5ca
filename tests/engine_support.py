"""What the engine's unit and integration tests share: a tool definition, a wait for the
generation thread, the check that a recorded call holds what the engine sampled, and the calls a
run's store recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
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


def assert_ids_recorded(call: ModelCall) -> None:
    """The call was recorded with the engine's prompt and response ids, none of them missing."""
    assert not call.token_ids_missing
    assert call.prompt_token_ids
    assert call.response_token_ids


def assert_logprobs_of(model: Any, call: ModelCall) -> None:
    """The recorded logprobs are ``model``'s (a transformers causal LM) for exactly the recorded ids."""
    import torch

    assert_ids_recorded(call)
    assert call.response_logprobs
    prompt, output = call.prompt_token_ids, call.response_token_ids
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1].gather(
        -1, torch.tensor(output)[:, None]
    )
    assert torch.allclose(torch.tensor(call.response_logprobs), expected.squeeze(-1), atol=1e-3)


async def stored_calls(store_path: Path) -> list[ModelCall]:
    """Every model call the gateway recorded in the SQLite store at ``store_path``, rollout by rollout."""
    from fulgor.store.sqlite import SqliteStore
    from fulgor.types import ModelCall

    store = SqliteStore(store_path)
    try:
        calls = []
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id, name="fulgor.model_call")
            calls += [ModelCall.model_validate(span.attributes["fulgor.model_call"]) for span in spans]
        return calls
    finally:
        await store.close()
