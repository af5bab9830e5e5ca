"""Spans -> chat transcripts: conversations chained call by call, and a reason for every rollout left out."""

from __future__ import annotations

from typing import Any

import pytest

from fulgor import semconv
from fulgor.adapters.transcripts import Transcript, Unusable, rollout_transcripts
from fulgor.types import ModelCall, Rollout, Span

SYSTEM = {"role": "system", "content": "Use the calculator."}
USER = {"role": "user", "content": "What is 6 times 7?"}
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
}


def rollout(status: str = "succeeded") -> Rollout:
    return Rollout(rollout_id="ro-1", input={}, group_id="g", enqueue_time=0.0, status=status)


def span(n: int, name: str, attributes: dict[str, Any]) -> Span:
    return Span(
        rollout_id="ro-1", attempt_id="at-1", sequence_id=n, trace_id="t", span_id=f"s{n}", name=name,
        start_time=float(n), attributes=attributes,
    )  # fmt: skip


def spans(
    *calls: tuple[list[dict[str, Any]], dict[str, Any]], reward: float | None = 1.0, **call: Any
) -> list[Span]:
    """One model call span per (request messages, response message), then the reward."""
    out = []
    for messages, message in calls:
        record = ModelCall(
            request={"messages": messages, "tools": TOOLS},
            response={"message": message, "finish_reason": call.get("finish_reason", "stop")},
            token_ids_missing=True,
            agent_name=call.get("agent"),
        )
        out.append(
            span(
                len(out) + 1,
                semconv.SPAN_MODEL_CALL,
                {semconv.ATTR_MODEL_CALL: record.model_dump(mode="json")},
            )
        )
    if reward is not None:
        out.append(span(len(out) + 1, semconv.SPAN_REWARD, {semconv.ATTR_REWARD_VALUE: reward}))
    return out


TOOL_TURN = {"role": "assistant", "content": "", "tool_calls": [CALL], "refusal": None}
ANSWER = {"role": "assistant", "content": "Answer: 42"}
# What the openai SDK sends back for the tool turn (model_dump(exclude_none=True)): no content key.
SENT_BACK = {"role": "assistant", "tool_calls": [{**CALL, "function": dict(CALL["function"])}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "42"}


def test_a_conversation_that_goes_on_is_one_transcript_with_each_teacher_turn() -> None:
    [transcript] = rollout_transcripts(
        rollout(), spans(([SYSTEM, USER], TOOL_TURN), ([SYSTEM, USER, SENT_BACK, RESULT], ANSWER))
    )
    assert isinstance(transcript, Transcript)
    assert [m["role"] for m in transcript.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert transcript.turns == (2, 4)
    assert transcript.messages[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL],
    }  # no refusal
    assert (transcript.tools, transcript.reward, transcript.group_id) == (TOOLS, 1.0, "g")


def test_history_the_agent_rewrote_starts_a_new_transcript_and_is_context() -> None:
    edited = {"role": "assistant", "content": "I used the calculator."}
    first, second = rollout_transcripts(
        rollout(), spans(([SYSTEM, USER], TOOL_TURN), ([SYSTEM, USER, edited, RESULT], ANSWER))
    )
    assert isinstance(first, Transcript)
    assert isinstance(second, Transcript)
    assert first.turns == (2,)
    assert second.turns == (4,)  # the edited turn is the agent's, not the teacher's: context


@pytest.mark.parametrize(
    ("status", "built", "says"),
    [
        ("failed", spans(([USER], ANSWER)), "did not succeed (status failed)"),
        ("succeeded", spans(([USER], ANSWER), reward=None), "has no reward"),
        ("succeeded", spans(reward=1.0), "made no model call"),
        ("succeeded", spans(([USER], ANSWER), finish_reason="length"), "cut off at max_tokens"),
        ("succeeded", spans(([], ANSWER)), "a text completion"),
        (
            "succeeded",
            spans(
                (
                    [USER],
                    {
                        **TOOL_TURN,
                        "tool_calls": [{**CALL, "function": {"name": "calculator", "arguments": "{"}}],
                    },
                )
            ),
            "are not JSON",
        ),
    ],
)
def test_a_rollout_that_gives_no_transcript_says_why(status: str, built: list[Span], says: str) -> None:
    found = rollout_transcripts(rollout(status), built)
    assert isinstance(found, Unusable)
    assert found.rollout_id == "ro-1"
    assert says in found.reason


def test_agent_match_keeps_the_chosen_agents_calls() -> None:
    built = spans(([USER], ANSWER), agent="writer")
    assert isinstance(rollout_transcripts(rollout(), built, agent_match="writer")[0], Transcript)  # type: ignore[index]
    left = rollout_transcripts(rollout(), built, agent_match="checker")
    assert isinstance(left, Unusable)
    assert "no model call of an agent matching 'checker'" in left.reason


def test_a_transcript_written_by_hand_learns_every_assistant_turn() -> None:
    transcript = Transcript.of([SYSTEM, USER, TOOL_TURN, RESULT, ANSWER], TOOLS)
    assert transcript.turns == (2, 4)
