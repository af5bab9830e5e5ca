"""What the rollout page shows of each call follows the trainer's own rules: which calls are trained,
how their tokens sit in a row, merge breaks, missing ids; and the span tree, curves and diffs."""

from __future__ import annotations

from typing import Any

from fulgor import semconv
from fulgor.adapters.trajectory import build_trajectory
from fulgor.dashboard.views import call_views, charts, prompt_diffs, span_tree
from fulgor.types import ModelCall, PromptTemplate, ResourcesVersion, Rollout, Span


def span(
    span_id: str, parent: str | None, start: float, end: float | None, name: str = "op", **attributes: Any
) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        trace_id="t" * 32,
        span_id=span_id,
        parent_id=parent,
        name=name,
        start_time=start,
        end_time=end,
        attributes=attributes,
    )


def call(
    span_id: str, sequence_id: int, prompt: list[int] | None, response: list[int] | None, **fields: Any
) -> Span:
    logprobs = fields.pop("logprobs", None if response is None else [-0.5] * len(response))
    record = ModelCall(
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"},
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=logprobs,
        **fields,
    )
    attributes = {semconv.ATTR_MODEL_CALL: record.model_dump(mode="json")}
    return span(
        span_id, None, float(sequence_id), float(sequence_id) + 0.5, semconv.SPAN_MODEL_CALL, **attributes
    ).model_copy(update={"sequence_id": sequence_id})


def parts(view: Any) -> list[tuple[int, str]]:
    return [(t.token_id, t.part) for t in [*view.prompt, *view.response]]


def test_a_merged_call_marks_the_row_so_far_and_its_new_context() -> None:
    spans = [
        call("a", 1, [1, 2], [3, 4]),
        call("b", 2, [1, 2, 3, 4, 9], [5]),  # extends the row: 9 is the tool result (context)
        call("c", 3, [7, 7], [8]),  # does not: a merge break, a new row
    ]
    first, second, third = call_views(spans, agent_match=None, rollout_problem=None, decode=None)
    assert parts(first) == [(1, "context"), (2, "context"), (3, "sampled"), (4, "sampled")]
    assert parts(second) == [
        (1, "seen"),
        (2, "seen"),
        (3, "seen"),
        (4, "seen"),
        (9, "context"),
        (5, "sampled"),
    ]
    assert (first.row, second.row, third.row) == (0, 0, 1)
    assert second.merged
    assert not second.merge_break
    assert third.merge_break
    assert "merge break" in third.reason
    # The same rows the trainer builds: the page shows what training does.
    rollout = Rollout(rollout_id="ro-1", input=None, enqueue_time=0.0)
    trajectory, report = build_trajectory(rollout, spans, reward=1.0)
    assert trajectory is not None
    assert report.merge_breaks == 1
    assert [row.calls for row in trajectory.rows] == [[0, 1], [2]]
    assert second.response[0].logprob == -0.5
    assert "logprob -0.5000" in second.response[0].title


def test_tokens_past_max_trajectory_tokens_are_cut_off_as_training_cuts_them() -> None:
    spans = [call("a", 1, [1, 2], [3, 4]), call("b", 2, [1, 2, 3, 4, 9], [5, 6]), call("c", 3, [7] * 6, [8])]
    first, second, third = call_views(
        spans, agent_match=None, rollout_problem=None, decode=None, max_tokens=6
    )
    assert first.trained
    assert [t.part for t in first.response] == ["sampled", "sampled"]
    assert [t.part for t in second.response] == ["sampled", "truncated"]  # place 6 of its row is cut off
    assert second.trained
    assert "last 1 sampled tokens cut off" in second.reason
    assert not third.trained
    assert "cut off" in third.reason
    rollout = Rollout(rollout_id="ro-1", input=None, enqueue_time=0.0)
    trajectory, report = build_trajectory(rollout, spans, reward=1.0, max_tokens=6)
    assert trajectory is not None
    assert [len(row.token_ids) for row in trajectory.rows] == [6]  # the same cut
    assert (report.truncated_rows, report.dropped_rows) == (2, 1)


def test_calls_left_out_say_why_and_mark_every_token() -> None:
    spans = [
        call("a", 1, None, None, token_ids_missing=True),
        call("b", 2, [1], [2], logprobs=None),
        call("c", 3, [1], [2], agent_name="checker"),
        call("d", 4, [1], [2], agent_name="writer", error="upstream failed"),
        call("e", 5, [1], [2], agent_name="writer"),
    ]
    views = call_views(spans, agent_match="writer", rollout_problem=None, decode=None)
    assert [v.trained for v in views] == [False, False, False, False, True]
    assert "not one the run trains" in views[0].reason  # agent_match comes first, as in training
    assert views[0].ids_missing
    assert "not one the run trains" in views[2].reason
    assert "failed" in views[3].reason
    assert all(t.part == "untrained" for v in views[:4] for t in [*v.prompt, *v.response])
    no_match = call_views(spans[:2], agent_match=None, rollout_problem=None, decode=None)
    assert "token ids are missing" in no_match[0].reason
    assert "logprobs are missing" in no_match[1].reason


def test_a_rollout_that_is_not_trained_leaves_every_call_out() -> None:
    views = call_views(
        [call("a", 1, [1], [2])], agent_match=None, rollout_problem="the rollout has no reward", decode=None
    )
    assert not views[0].trained
    assert views[0].reason == "the rollout has no reward"


def test_token_text_comes_from_the_decoder_and_ids_stay_as_stored() -> None:
    (view,) = call_views(
        [call("a", 1, [10, 11], [12])], agent_match=None, rollout_problem=None, decode=lambda i: f"<{i}>"
    )
    assert [(t.token_id, t.text) for t in [*view.prompt, *view.response]] == [
        (10, "<10>"),
        (11, "<11>"),
        (12, "<12>"),
    ]


def test_the_chat_view_lists_messages_tool_calls_and_results() -> None:
    record = ModelCall(
        request={
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "add 2 and 3"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "function": {"name": "add", "arguments": '{"a": 2}'}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "5"},
            ]
        },
        response={"message": {"role": "assistant", "content": "5"}, "finish_reason": "stop"},
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )
    spans = [
        span(
            "a",
            None,
            0,
            1,
            semconv.SPAN_MODEL_CALL,
            **{semconv.ATTR_MODEL_CALL: record.model_dump(mode="json")},
        )
    ]
    (view,) = call_views(spans, agent_match=None, rollout_problem=None, decode=None)
    assert [m["role"] for m in view.messages] == ["user", "assistant", "tool"]
    assert view.messages[0]["content"] == "add 2 and 3"
    assert view.messages[1]["tool_calls"] == [{"name": "add", "arguments": '{"a": 2}', "id": "c1"}]
    assert view.messages[2]["tool_call_id"] == "c1"
    assert view.reply["content"] == "5"
    assert view.reply["finish_reason"] == "stop"


def test_the_span_tree_nests_children_and_survives_orphans_and_cycles() -> None:
    spans = [
        span("root", None, 0.0, 10.0),
        span("child", "root", 1.0, 3.0),
        span("grandchild", "child", 2.0, 2.5),
        span("orphan", "never-stored", 5.0, None),
        span("loop-a", "loop-b", 6.0, 7.0),
        span("loop-b", "loop-a", 6.5, 7.0),
    ]
    tree = span_tree(spans)
    assert [(n.span.span_id, n.depth) for n in tree][:4] == [
        ("root", 0),
        ("child", 1),
        ("grandchild", 2),
        ("orphan", 0),
    ]
    assert {n.span.span_id for n in tree} == {s.span_id for s in spans}  # each span once, cycles included
    child = tree[1]
    assert (round(child.left), round(child.width)) == (10, 20)
    assert span_tree([]) == []


def test_charts_skip_missing_values_and_sum_drift_losses() -> None:
    history = [
        {"step": 1, "reward_mean": 0.1, "loss": None, "drift/calls_missing_ids": 2, "drift/merge_breaks": 5},
        {"step": 2, "reward_mean": 0.5, "val_accuracy": 0.4, "drift/calls_missing_ids": 0},
        {"step": 3, "reward_mean": float("nan")},
    ]
    by_name = {chart.name: chart for chart in charts(history)}
    assert [p[2:] for p in by_name["training reward"].points] == [(1, 0.1), (2, 0.5)]
    assert [p[2:] for p in by_name["validation accuracy"].points] == [(2, 0.4)]
    assert "loss" not in by_name
    drift = by_name["drift (calls or tokens not trained as sampled)"]
    assert [p[3] for p in drift.points] == [2.0, 0.0, 0.0]  # merge breaks train exactly: not a loss


def test_prompt_diffs_show_what_changed_and_hide_api_keys() -> None:
    from fulgor.types import LLM

    def version(number: int, template: str) -> ResourcesVersion:
        resources = {
            "prompt": PromptTemplate(template=template),
            "llm": LLM(endpoint="http://x/v1", model="m", api_key="sk-secret"),
        }
        return ResourcesVersion(
            resources_id=f"r{number}", version=number, resources=resources, create_time=0.0
        )

    shown = prompt_diffs(
        [version(1, "Answer.\nBe brief."), version(2, "Answer.\nBe exact."), version(3, "Answer.\nBe exact.")]
    )
    assert [v.version for v, _ in shown] == [3, 2, 1]
    changes = {v.version: {c.name: c for c in cs} for v, cs in shown}
    assert not changes[3]["prompt"].changed
    assert not changes[1]["prompt"].changed
    diff = changes[2]["prompt"].diff
    assert ("remove", "-Be brief.") in diff
    assert ("add", "+Be exact.") in diff
    assert all("sk-secret" not in c.text for cs in changes.values() for c in cs.values())
