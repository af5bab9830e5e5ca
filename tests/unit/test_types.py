"""Wire models: JSON round trips, validation messages that name the field, prompt templates."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from pydantic import TypeAdapter

from fulgor.types import (
    LLM,
    Attempt,
    AttemptedRollout,
    ModelCall,
    PromptTemplate,
    Resource,
    ResourcesVersion,
    Reward,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    Span,
    SpanEvent,
    SpanStatus,
    StoreStats,
    Worker,
)

ATTEMPT = Attempt(
    rollout_id="ro-1", attempt_id="at-1", sequence_id=1, worker_id="w", start_time=1.0, last_active_time=2.0
)
ROLLOUT = Rollout(
    rollout_id="ro-1",
    input={"question": "2+2", "answer": 4},
    group_id="g",
    config=RolloutConfig(timeout_seconds=5, unresponsive_seconds=1, max_attempts=3, retry_on=("timeout",)),
    metadata={"k": [1, 2]},
    enqueue_time=0.5,
)

EXAMPLES: list[pydantic.BaseModel] = [
    RolloutConfig(),
    RolloutRequest(input=[1, "two", None], mode="val", group_id="g1", metadata={"a": 1}),
    ROLLOUT,
    ATTEMPT,
    AttemptedRollout(**dict(ROLLOUT), attempt=ATTEMPT),
    Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=3,
        trace_id="t" * 32,
        span_id="s" * 16,
        parent_id="p",
        name="fulgor.model_call",
        start_time=1.0,
        end_time=2.0,
        attributes={"nested": {"ids": [1, 2, 3]}},
        events=(SpanEvent(name="e", time=1.5, attributes={"x": 1}),),
        status=SpanStatus(code="error", message="boom"),
        resource={"service.name": "agent"},
    ),
    ResourcesVersion(
        resources_id="r",
        version=2,
        resources={
            "llm": LLM(endpoint="http://127.0.0.1:1/v1", model="m", sampling_parameters={"temperature": 0.7}),
            "prompt": PromptTemplate(template="Hi {{ name }}", engine="jinja"),
        },
        create_time=3.0,
    ),
    ModelCall(
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"content": "yo"},
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
        model_version=1,
        latency_seconds=0.01,
    ),
    ModelCall(request={}, token_ids_missing=True),
    Reward(value=1.0),
    Reward(value=0.5, primary="acc", values={"acc": 0.5, "format": 1.0}),
    Worker(worker_id="w", first_seen_time=1.0, last_heartbeat_time=2.0, stats={"busy": 1}),
    StoreStats(rollouts={"queuing": 1}, attempts={}, spans=0, workers=0, resources_versions=0),
]


@pytest.mark.parametrize("model", EXAMPLES, ids=lambda m: type(m).__name__)
def test_json_round_trip(model: pydantic.BaseModel) -> None:
    restored = type(model).model_validate_json(model.model_dump_json())
    assert restored == model
    assert restored.model_dump(mode="json") == model.model_dump(mode="json")


def test_models_are_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        ROLLOUT.status = "failed"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: RolloutRequest(input=1, mode="training"), "mode"),
        (lambda: RolloutConfig(max_attempts=0), "max_attempts"),
        (lambda: RolloutConfig(timeout_seconds=-1), "timeout_seconds"),
        (lambda: RolloutConfig(retry_on=("succeeded",)), "retry_on"),
        (lambda: RolloutRequest(input=1, unknown=2), "unknown"),
        (
            lambda: Span(rollout_id="", attempt_id="a", trace_id="t", span_id="s", name="n", start_time=0),
            "rollout_id",
        ),
    ],
)
def test_invalid_payload_names_the_field(build: Any, field: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        build()
    assert field in str(caught.value)


def test_span_end_before_start_is_rejected() -> None:
    with pytest.raises(pydantic.ValidationError, match="end_time"):
        Span(rollout_id="r", attempt_id="a", trace_id="t", span_id="s", name="n", start_time=2, end_time=1)


def test_model_call_requires_token_ids_unless_flagged() -> None:
    with pytest.raises(pydantic.ValidationError, match="token_ids_missing"):
        ModelCall(request={}, response={"content": "x"})
    with pytest.raises(pydantic.ValidationError, match="one entry per response token"):
        ModelCall(request={}, prompt_token_ids=[1], response_token_ids=[2, 3], response_logprobs=[-1.0])


def test_reward_primary_must_match_values() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"primary|values"):
        Reward(value=1.0, primary="acc", values={"acc": 0.0})


def test_resources_discriminate_by_kind() -> None:
    adapter: TypeAdapter[Resource] = TypeAdapter(Resource)
    assert isinstance(adapter.validate_python({"kind": "llm", "endpoint": "http://x/v1", "model": "m"}), LLM)
    template = adapter.validate_python({"kind": "prompt_template", "template": "{a}"})
    assert isinstance(template, PromptTemplate)


def test_prompt_template_engines() -> None:
    f_string = PromptTemplate(template="Solve {question} in {steps} steps")
    assert f_string.format(question="2+2", steps=1) == "Solve 2+2 in 1 steps"
    assert f_string.placeholders == {"question", "steps"}
    jinja = PromptTemplate(
        template="{% if hint %}Hint: {{ hint }}. {% endif %}Q: {{ question }}", engine="jinja"
    )
    assert jinja.format(question="2+2", hint="add") == "Hint: add. Q: 2+2"
    assert jinja.placeholders == {"hint", "question"}
    with pytest.raises(KeyError, match="steps"):
        f_string.format(question="x")
    with pytest.raises(KeyError, match="question"):
        jinja.format(hint="h")
