"""APO's parts on their own: reading an editor's answer, the Pareto weights, what the critic and
editor are sent, the dataset cycle, the settings refused, and which agents can receive a prompt."""

from __future__ import annotations

from typing import Any

import pytest

from fulgor import APO, LLM, PromptTemplate, rollout
from fulgor.algorithms.apo import pareto_weights, read_edit
from fulgor.algorithms.apo.messages import RolloutView, critic_messages, editor_messages
from fulgor.algorithms.apo.search import _cycle
from fulgor.algorithms.base import ResourceAlgorithm, missing_members
from fulgor.errors import ConfigError
from fulgor.runner import SubprocessAgent
from fulgor.training.session import agent_prompt_problem

OPTIMIZER = LLM(endpoint="http://127.0.0.1:9/v1", model="critic")
F_STRING = PromptTemplate(template="Book a room for {attendees} on {date}.")
JINJA = PromptTemplate(template="Book a room for {{ attendees }} on {{ date }}.", engine="jinja")


@pytest.mark.parametrize(
    ("original", "answer", "template"),
    [
        (F_STRING, "Book the smallest room for {attendees} on {date}.", None),
        (F_STRING, "```text\nBook a free room for {attendees} on {date}.\n```",
         "Book a free room for {attendees} on {date}."),
        (F_STRING, "Book a room for {attendees} on {date}. Use {{braces}} literally.", None),
        (JINJA, "For {{ attendees }} on {{ date }}: the closest room.", None),
    ],
)  # fmt: skip
def test_a_usable_edit_keeps_every_placeholder(
    original: PromptTemplate, answer: str, template: str | None
) -> None:
    edited, problem = read_edit(original, answer)
    assert problem is None
    assert edited is not None
    assert edited.engine == original.engine
    assert edited.placeholders == original.placeholders
    if template is not None:
        assert edited.template == template


@pytest.mark.parametrize(
    ("original", "answer", "reason"),
    [
        (F_STRING, "Book a room on {date}.", "drops the placeholder {attendees}"),
        (F_STRING, "Book a room.", "drops the placeholders {attendees}, {date}"),
        (F_STRING, "Book a room for {people} on {date}.",
         "drops the placeholder {attendees}, which the agent fills and adds {people}"),
        (F_STRING, "Book a room for {attendees on {date}.", "not a valid f-string template"),
        (JINJA, "For {{ attendees } on {{ date }}.", "not a valid jinja template"),
        (JINJA, "For {{ attendees }} on {{ day }}.", "adds {day}"),
        (F_STRING, "   \n", "answered with no text"),
        (F_STRING, F_STRING.template + "\n", "returned the prompt unchanged"),
        (F_STRING, "x {attendees} {date}" * 2000, "over 20 times the prompt it edits"),
    ],
)  # fmt: skip
def test_an_unusable_edit_is_refused_with_its_reason(
    original: PromptTemplate, answer: str, reason: str
) -> None:
    edited, problem = read_edit(original, answer)
    assert edited is None
    assert problem is not None
    assert reason in problem


def test_pareto_weights_count_the_tasks_each_undominated_candidate_is_best_on() -> None:
    scores = {
        "seed": {"0": 0.0, "1": 0.0, "2": 1.0},
        "a": {"0": 1.0, "1": 0.0, "2": 1.0},  # dominates seed
        "b": {"0": 0.0, "1": 1.0, "2": 1.0},
        "c": {"0": 1.0, "1": 1.0},  # best on two tasks, but never ran task 2
    }
    assert pareto_weights(scores) == {"a": 2, "b": 2, "c": 2}
    assert pareto_weights({"only": {"0": 0.0}}) == {"only": 1}
    assert pareto_weights({"x": {"0": 1.0}, "y": {"0": 1.0}}) == {"x": 1, "y": 1}


def test_the_critic_sees_the_prompt_the_rollouts_rewards_and_feedback() -> None:
    prompts = {"request": F_STRING, "system_prompt": PromptTemplate(template="You book rooms.")}
    views = [
        RolloutView(
            "succeeded", 0.0, "expected Birch, got Aspen", ["[user] Book", "[assistant] calls list_rooms({})"]
        ),
        RolloutView("failed", None, None, []),
    ]
    system, user = critic_messages("request", prompts, views)
    assert system["role"] == "system"
    text = user["content"]
    assert f'<prompt name="request">\n{F_STRING.template}\n</prompt>' in text
    assert '<other_prompt name="system_prompt">\nYou book rooms.\n</other_prompt>' in text
    assert (
        '<rollout index="1" reward="0" status="succeeded">\n<feedback>expected Birch, got Aspen</feedback>'
        in text
    )
    assert "[assistant] calls list_rooms({})" in text
    assert '<rollout index="2" reward="none" status="failed">' in text
    system, user = editor_messages("request", F_STRING, "- State the capacity rule.\n")
    assert "<critique>\n- State the capacity rule.\n</critique>" in user["content"]
    assert (
        "Keep exactly these placeholders, in Python str.format ({name}) syntax: {attendees}, {date}"
        in user["content"]
    )
    assert "jinja2 ({{ name }}) syntax" in editor_messages("request", JINJA, "x")[1]["content"]


def test_the_dataset_cycle_is_every_task_once_per_pass_and_the_same_on_resume() -> None:
    first = _cycle(5, 0, 5, seed=1)
    assert sorted(first) == list(range(5))
    assert sorted(_cycle(5, 5, 5, seed=1)) == list(range(5))
    assert _cycle(5, 3, 4, seed=1) == _cycle(5, 0, 7, seed=1)[3:]


def test_apo_is_a_resource_algorithm() -> None:
    algorithm = APO(prompts={"prompt_template": "Solve {q}."}, optimizer=OPTIMIZER)
    assert isinstance(algorithm, ResourceAlgorithm)
    assert missing_members(algorithm) == []
    assert algorithm.prompts["prompt_template"] == PromptTemplate(template="Solve {q}.")
    assert algorithm.sampling_parameters("val") == {"temperature": 0.0}
    assert algorithm.sampling_parameters("train") == {"temperature": 1.0}
    assert algorithm.hyperparameters()["critic_model"] == "critic"
    assert (algorithm.beam_width, algorithm.branch_factor, algorithm.max_steps) == (4, 4, 3)
    assert (algorithm.gradient_batch_size, algorithm.val_batch_size) == (4, 16)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"prompts": {}}, "APO needs prompts="),
        ({"prompts": {"llm": "x"}}, "other than 'llm'"),
        ({"prompts": {"p": ""}}, "must be a PromptTemplate (or its text) that is not empty"),
        ({"prompts": {"p": "Solve {q."}}, "is not a valid f-string template"),
        ({"search": "random"}, "search must be 'beam' or 'pareto'"),
        ({"beam_width": 0}, "beam_width must be a whole number >= 1"),
        ({"max_rollouts": 0}, "max_rollouts must be a whole number >= 1 or None"),
        ({"optimizer": "gpt-4.1"}, "the critic must be an LLM(endpoint=..., model=...)"),
        ({"optimizer_timeout_seconds": 0}, "optimizer_timeout_seconds > 0"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as error:
        APO(**{"prompts": {"p": "Solve {q}."}, "optimizer": OPTIMIZER, **settings})
    assert says in error.value.message


@rollout
def takes_prompt(task: Any, llm: LLM, prompt_template: PromptTemplate) -> float:
    return 1.0


@rollout
def takes_everything(task: Any, resources: dict[str, Any]) -> float:
    return 1.0


def test_a_prompt_the_agent_cannot_receive_is_named() -> None:
    prompts = {"prompt_template": F_STRING, "system_prompt": F_STRING}
    problem = agent_prompt_problem(takes_prompt, prompts)
    assert problem is not None
    assert "takes no parameter named 'system_prompt'" in problem
    assert "its parameters: llm, prompt_template" in problem
    assert agent_prompt_problem(takes_prompt, {"prompt_template": F_STRING}) is None
    assert agent_prompt_problem(takes_everything, prompts) is None  # it gets every resource
    assert agent_prompt_problem(SubprocessAgent(["true"]), prompts) is None  # FULGOR_RESOURCES
