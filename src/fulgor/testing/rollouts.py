"""Synthetic rollouts written through a real store, for tests and benchmarks of what reads stores.

:func:`write_rollouts` enqueues, claims and ends rollouts the way runners do, with the spans an agent
run leaves: a root span naming the agent, model calls (messages, tool calls, the engine's token ids
and logprobs, each call's prompt extending the previous call's tokens as a multi-turn chat does),
a tool span and a reward span with feedback. Nothing in it is a model: the texts are made up, and
``text`` (say, markup) is put into every untrusted field, the task, the outputs, the tool results,
the feedback and a span attribute, so that a test can check how each is shown.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import Any

from fulgor import semconv
from fulgor.types import ModelCall, Reward, RolloutRequest, Span

__all__ = ["write_rollouts"]


async def write_rollouts(
    store: Any,
    count: int,
    *,
    calls: int = 3,
    group_size: int = 4,
    rollouts_per_step: int = 16,
    agents: Sequence[str] = ("writer", "checker"),
    text: str = "",
    failed_every: int = 0,
    missing_ids_every: int = 0,
    seed: int = 0,
    first_index: int = 0,
    batch: int = 500,
    start_time: float = 1_800_000_000.0,
    resources_id: str | None = None,
) -> list[str]:
    """Write ``count`` ended rollouts into ``store`` (any :class:`~fulgor.store.base.Store`; see the
    module docstring); returns their ids in order.

    Each has ``calls + 4`` spans (root, one per call, a tool span, a reward span, one more). Every
    ``failed_every``-th rollout (0: none) fails; the others succeed with a reward in [0, 1]. The
    first call of every ``missing_ids_every``-th rollout (0: none) has no token ids, as a call through
    an upstream that returns none.
    Rollout ``i`` (counted from ``first_index``, so that later calls continue the same run) belongs
    to step ``i // rollouts_per_step + 1`` and to a group of ``group_size``.
    """
    rng = random.Random(seed)
    ids: list[str] = []
    for first in range(first_index, first_index + count, batch):
        size = min(batch, first_index + count - first)
        requests = []
        for i in range(first, first + size):
            step = i // rollouts_per_step + 1
            requests.append(
                RolloutRequest(
                    input={"question": f"What is {i} + {i % 7}? {text}", "index": i},
                    mode="val" if i % 10 == 9 else "train",
                    group_id=f"step-{step}-group-{i // group_size}",
                    resources_id=resources_id,
                    metadata={"step": step},
                )
            )
        await store.enqueue(requests)
        claimed = await store.claim("synthetic-worker", limit=size)
        spans: list[Span] = []
        for offset, attempted in enumerate(claimed):
            index = first + offset
            spans += _spans(
                attempted.rollout_id,
                attempted.attempt.attempt_id,
                index,
                calls,
                agents,
                text,
                rng,
                start_time,
                missing_ids_every > 0 and index % missing_ids_every == missing_ids_every - 1,
            )
        await store.add_spans(spans)
        for offset, attempted in enumerate(claimed):
            index = first + offset
            failed = failed_every > 0 and index % failed_every == failed_every - 1
            await store.update_attempt(
                attempted.rollout_id,
                attempted.attempt.attempt_id,
                status="failed" if failed else "succeeded",
                error=f"the agent raised ValueError {text}" if failed else None,
            )
            ids.append(attempted.rollout_id)
    return ids


def _spans(
    rollout_id: str,
    attempt_id: str,
    index: int,
    calls: int,
    agents: Sequence[str],
    text: str,
    rng: random.Random,
    start_time: float,
    missing_ids: bool,
) -> list[Span]:
    trace = uuid.uuid4().hex
    t0 = start_time + index * 2.0
    root_id = uuid.uuid4().hex[:16]

    def span(name: str, start: float, end: float, parent: str | None, **attributes: Any) -> Span:
        return Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            trace_id=trace,
            span_id=uuid.uuid4().hex[:16] if name != "agent.run" else root_id,
            parent_id=parent,
            name=name,
            start_time=start,
            end_time=end,
            attributes=attributes,
        )

    agent = agents[index % len(agents)] if agents else None
    root_attributes = {semconv.ATTR_AGENT_NAME: agent} if agent else {}
    spans = [span("agent.run", t0, t0 + 1.5, None, **root_attributes, note=f"run {index} {text}")]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You add numbers with the calculator tool."},
        {"role": "user", "content": f"What is {index} + {index % 7}? {text}"},
    ]
    row: list[int] = [1, 5, 9, 2, 7][: 3 + index % 3]
    for call_index in range(calls):
        response = [rng.randrange(3, 500) for _ in range(4 + rng.randrange(6))]
        logprobs = [-rng.random() * 3 for _ in response]
        last = call_index == calls - 1
        message: dict[str, Any] = {"role": "assistant", "content": f"answer {index} {text}"}
        if not last:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{call_index}",
                        "type": "function",
                        "function": {
                            "name": "calculator",
                            "arguments": f'{{"expression": "{index}+1 {text}"}}',
                        },
                    }
                ],
            }
        no_ids = missing_ids and call_index == 0
        record = ModelCall(
            request={"messages": list(messages), "temperature": 1.0},
            response={"message": message, "finish_reason": "stop" if last else "tool_calls"},
            prompt_token_ids=None if no_ids else list(row),
            response_token_ids=None if no_ids else response,
            response_logprobs=None if no_ids else logprobs,
            token_ids_missing=no_ids,
            model_version=index // 64,
            latency_seconds=0.05,
            agent_name=agent,
        )
        start = t0 + 0.1 + call_index * 0.4
        spans.append(
            span(
                semconv.SPAN_MODEL_CALL,
                start,
                start + 0.2,
                root_id,
                **{semconv.ATTR_MODEL_CALL: record.model_dump(mode="json")},
            )
        )
        row = row + response + [rng.randrange(3, 500) for _ in range(3)]  # the tool result's tokens
        messages = [
            *messages,
            message,
            {"role": "tool", "tool_call_id": f"call_{call_index}", "content": f"{index + 1} {text}"},
        ]
    spans.append(
        span(
            semconv.SPAN_OPERATION,
            t0 + 0.35,
            t0 + 0.4,
            root_id,
            **{
                semconv.ATTR_OPERATION_NAME: "calculator",
                semconv.ATTR_OPERATION_OUTPUT: f"{index + 1} {text}",
            },
        )
    )
    reward = Reward(value=round(rng.random(), 3), feedback=f"expected {index + index % 7} {text}")
    spans.append(
        span(
            semconv.SPAN_REWARD,
            t0 + 1.4,
            t0 + 1.4,
            root_id,
            **{
                semconv.ATTR_REWARD_VALUE: reward.value,
                semconv.ATTR_REWARD_PRIMARY: reward.primary,
                semconv.ATTR_REWARD_VALUES: {"reward": reward.value},
                semconv.ATTR_REWARD_FEEDBACK: reward.feedback,
            },
        )
    )
    spans.append(span("custom.step", t0 + 1.41, t0 + 1.45, root_id, **{f"attr {text}": text or "value"}))
    return spans
