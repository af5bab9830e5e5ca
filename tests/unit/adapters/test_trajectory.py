"""Spans -> trajectories: prefix merges, forced new rows, missing ids, rewards, agent selection."""

from __future__ import annotations

from typing import Any

import pytest

from fulgor import semconv
from fulgor.adapters import DriftReport, TrajectoryRow, build_trajectory, verify_rows
from fulgor.types import ModelCall, Rollout, Span

ROLLOUT = Rollout(rollout_id="ro-1", input={}, group_id="g", enqueue_time=0.0, resources_id="resources-3")


class Spans:
    """Builds a rollout's spans in store order."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    def _add(self, name: str, attributes: dict[str, Any]) -> None:
        n = len(self.spans) + 1
        self.spans.append(
            Span(
                rollout_id="ro-1",
                attempt_id="at-1",
                sequence_id=n,
                trace_id="t",
                span_id=f"s{n}",
                name=name,
                start_time=float(n),
                attributes=attributes,
            )
        )

    def call(
        self,
        prompt: list[int] | None,
        response: list[int] | None,
        agent: str | None = None,
        *,
        with_logprobs: bool = True,
    ) -> Spans:
        logprobs = None
        if with_logprobs and response is not None:
            logprobs = [-0.1 * (i + 1) for i in range(len(response))]
        record = ModelCall(
            request={},
            prompt_token_ids=prompt,
            response_token_ids=response,
            response_logprobs=logprobs,
            token_ids_missing=prompt is None,
            agent_name=agent,
            model_version=1,
        )
        self._add(semconv.SPAN_MODEL_CALL, {semconv.ATTR_MODEL_CALL: record.model_dump(mode="json")})
        return self

    def failed(self, error: str = "upstream returned 500") -> Spans:
        record = ModelCall(request={}, error=error)
        self._add(semconv.SPAN_MODEL_CALL, {semconv.ATTR_MODEL_CALL: record.model_dump(mode="json")})
        return self

    def reward(self, value: float) -> Spans:
        self._add(semconv.SPAN_REWARD, {semconv.ATTR_REWARD_VALUE: value})
        return self


def test_prefix_continuation_merges_with_tool_tokens_masked() -> None:
    # turn 1: prompt [1,2,3] -> [4,5]; the tool result [6,7] is appended; turn 2 -> [8]
    spans = Spans().call([1, 2, 3], [4, 5]).call([1, 2, 3, 4, 5, 6, 7], [8]).reward(1.0).spans
    trajectory, report = build_trajectory(ROLLOUT, spans)
    assert trajectory is not None
    [row] = trajectory.rows
    assert row.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert row.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert row.sampled_logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.1])
    assert row.calls == [0, 1]
    assert trajectory.reward == 1.0
    assert trajectory.group_id == "g"
    assert report == DriftReport(calls_total=2, calls_trained=2)


def test_template_that_drops_earlier_reasoning_forces_a_new_row() -> None:
    # The second prompt re-renders turn 1 without its reasoning tokens [4]: not a prefix continuation.
    spans = Spans().call([1, 2], [4, 5]).call([1, 2, 5, 6], [7]).reward(0.5).spans
    trajectory, report = build_trajectory(ROLLOUT, spans)
    assert trajectory is not None
    assert [row.token_ids for row in trajectory.rows] == [[1, 2, 4, 5], [1, 2, 5, 6, 7]]
    assert [row.loss_mask for row in trajectory.rows] == [[0, 0, 1, 1], [0, 0, 0, 0, 1]]
    assert report.merge_breaks == 1
    assert report.id_mismatches == 0


def test_calls_without_ids_are_counted_and_never_trained() -> None:
    spans = Spans().call(None, None).call([1], [2]).reward(1.0).spans
    trajectory, report = build_trajectory(ROLLOUT, spans)
    assert trajectory is not None
    assert [row.token_ids for row in trajectory.rows] == [[1, 2]]
    assert report.calls_missing_ids == 1
    assert report.calls_trained == 1
    only_missing, report = build_trajectory(ROLLOUT, Spans().call(None, None).reward(1.0).spans)
    assert only_missing is None
    assert report.rollouts_without_calls == 1


def test_calls_without_their_logprobs_are_counted_and_never_trained() -> None:
    """The update weighs tokens by the engine's logprobs: a call that lacks them is not trained on
    with made-up values (a ModelCall's logprobs, when present, match its response ids one for one)."""
    spans = Spans().call([1], [2, 3], with_logprobs=False).call([7], [8]).reward(1.0).spans
    trajectory, report = build_trajectory(ROLLOUT, spans)
    assert trajectory is not None
    assert [row.token_ids for row in trajectory.rows] == [[7, 8]]
    assert trajectory.rows[0].sampled_logprobs == [0.0, -0.1]
    assert report.calls_missing_logprobs == 1
    assert report.calls_trained == 1


def test_truncation_and_dropped_rows_are_reported() -> None:
    spans = Spans().call([1, 2, 3], [4, 5, 6]).call([9, 9, 9, 9, 9], [7]).reward(1.0).spans
    trajectory, report = build_trajectory(ROLLOUT, spans, max_tokens=4)
    assert trajectory is not None
    # Row 1 keeps [1,2,3,4]; row 2 ([9]*5 + [7]) keeps only context after truncation, so it is dropped.
    assert [row.token_ids for row in trajectory.rows] == [[1, 2, 3, 4]]
    assert report.truncated_rows == 2
    assert report.dropped_rows == 1
    assert report.calls_trained == 1  # the dropped row's call is not trained
    assert report.id_mismatches == 0


def test_agent_match_trains_only_the_chosen_agents() -> None:
    spans = Spans().call([1], [2], agent="planner").call([3], [4], agent="coder").reward(1.0).spans
    trajectory, report = build_trajectory(ROLLOUT, spans, agent_match="^coder$")
    assert trajectory is not None
    assert [row.token_ids for row in trajectory.rows] == [[3, 4]]
    assert report.calls_not_matched == 1


def test_calls_of_different_agents_never_share_a_row() -> None:
    # The rewriter's prompt extends the writer's row exactly, yet it is another agent's call.
    spans = Spans().call([1, 2], [3], agent="write_query").call([1, 2, 3, 4], [5], agent="rewrite_query")
    spans.call([1, 2, 3, 4, 5, 6], [7], agent="rewrite_query").reward(1.0)
    trajectory, report = build_trajectory(ROLLOUT, spans.spans)
    assert trajectory is not None
    assert [(row.agent_name, row.token_ids) for row in trajectory.rows] == [
        ("write_query", [1, 2, 3]),
        ("rewrite_query", [1, 2, 3, 4, 5, 6, 7]),
    ]
    assert trajectory.rows[1].loss_mask == [0, 0, 0, 0, 1, 0, 1]  # the writer's tokens are context here
    assert report.merge_breaks == 0  # a new agent is not a broken conversation


def test_a_checker_between_two_trained_agents_stays_context() -> None:
    spans = Spans().call([1], [2], agent="write_query").call([1, 2, 3], [4], agent="check_query")
    spans.call([1, 2, 3, 4, 5], [6], agent="rewrite_query").reward(1.0)
    trajectory, report = build_trajectory(ROLLOUT, spans.spans, agent_match="write|rewrite")
    assert trajectory is not None
    assert [row.agent_name for row in trajectory.rows] == ["write_query", "rewrite_query"]
    rewrite = trajectory.rows[1]
    assert rewrite.token_ids == [1, 2, 3, 4, 5, 6]
    assert rewrite.loss_mask == [0, 0, 0, 0, 0, 1]  # the checker's answer (4) is context, never trained
    assert report.calls_not_matched == 1
    assert report.calls_trained == 2


def test_final_reward_is_the_last_reward_and_per_call_returns_are_discounted() -> None:
    spans = Spans().call([1], [2]).reward(0.5).call([1, 2, 3], [4]).reward(1.0).spans
    final, _ = build_trajectory(ROLLOUT, spans)
    assert final is not None
    assert final.reward == 1.0
    assert set(final.rows[0].returns) == {1.0}
    per_call, _ = build_trajectory(ROLLOUT, spans, reward_mode="per_call", discount=0.5)
    assert per_call is not None
    [row] = per_call.rows
    # call 0 return = 0.5 + 0.5 * 1.0 = 1.0; call 1 return = 1.0 (hand-computed)
    assert row.returns == [1.0, 1.0, 1.0, 1.0]
    per_call, _ = build_trajectory(ROLLOUT, spans, reward_mode="per_call", discount=0.0)
    assert per_call is not None
    assert per_call.rows[0].returns == [0.5, 0.5, 1.0, 1.0]


def test_per_call_returns_follow_time_not_store_order() -> None:
    """The gateway writes a call's span in a later batch than the reward the agent emitted after it:
    the reward is stored first, but it belongs to the call that started last before it, even when
    the runner's clock (the reward's) runs a little behind the gateway's (the call's end)."""
    spans = Spans().call([1], [2]).call([1, 2, 3], [4]).reward(1.0).spans
    first, second, reward = spans
    # Store order: call 0, reward, call 1. Times: call 0 runs 1.0-1.4, call 1 runs 1.5-2.0, the
    # reward is emitted at 1.999 by a clock a few milliseconds behind.
    reordered = [
        first.model_copy(update={"end_time": 1.4}),
        reward.model_copy(update={"sequence_id": 2, "start_time": 1.999}),
        second.model_copy(update={"sequence_id": 3, "start_time": 1.5, "end_time": 2.0}),
    ]
    trajectory, _ = build_trajectory(ROLLOUT, reordered, reward_mode="per_call", discount=0.0)
    assert trajectory is not None
    assert trajectory.rows[0].returns == [0.0, 0.0, 1.0, 1.0]


def test_an_explicit_reward_overrides_and_no_reward_means_no_trajectory() -> None:
    spans = Spans().call([1], [2]).spans
    assert build_trajectory(ROLLOUT, spans)[0] is None
    trajectory, _ = build_trajectory(ROLLOUT, spans, reward=0.25)
    assert trajectory is not None
    assert trajectory.reward == 0.25


def test_verify_rows_catches_a_token_that_is_not_the_engines() -> None:
    call = ModelCall(request={}, prompt_token_ids=[1, 2], response_token_ids=[3, 4])
    good = TrajectoryRow(token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], calls=[0])
    assert verify_rows([good], [call]) == 0
    retokenised = TrajectoryRow(token_ids=[1, 2, 3, 5], loss_mask=[0, 0, 1, 1], calls=[0])
    assert verify_rows([retokenised], [call]) == 1
    unmasked = TrajectoryRow(token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 0, 1], calls=[0])
    assert verify_rows([unmasked], [call]) == 1
    wrong_context = TrajectoryRow(token_ids=[9, 2, 3, 4], loss_mask=[0, 0, 1, 1], calls=[0])
    assert verify_rows([wrong_context], [call]) == 1


def losses(report: DriftReport) -> dict[str, int]:
    return {name: getattr(report, name) for name in DriftReport.LOSSES if getattr(report, name)}


def test_a_rollout_with_calls_but_no_reward_is_counted_as_such() -> None:
    trajectory, report = build_trajectory(ROLLOUT, Spans().call([1], [2]).call([1, 2, 3], [4]).spans)
    assert trajectory is None
    assert report.rollouts_without_reward == 1
    assert report.rollouts_without_calls == 0
    assert report.calls_total == 2
    assert report.calls_trained == 0  # nothing was returned to train on


def test_calls_trained_counts_only_calls_with_tokens_in_the_returned_rows() -> None:
    # A dropped row's call is not counted (see the truncation test); nor is a merged row's call
    # that truncation cuts away entirely:
    spans = Spans().call([1, 2], [3]).call([1, 2, 3, 4], [5]).reward(1.0).spans
    trajectory, report = build_trajectory(ROLLOUT, spans, max_tokens=4)
    assert trajectory is not None
    assert [row.token_ids for row in trajectory.rows] == [[1, 2, 3, 4]]
    assert report.calls_total == 2
    assert report.calls_trained == 1
    assert report.truncated_rows == 1


def test_a_reward_after_choices_of_one_request_goes_to_the_later_one() -> None:
    """The choices of one request (n > 1) share its start time: a tie goes to the later call."""
    spans = Spans().call([1], [2]).call([1], [3]).reward(1.0).spans
    first, second, reward = spans
    tied = [first, second.model_copy(update={"start_time": first.start_time}), reward]
    trajectory, _ = build_trajectory(ROLLOUT, tied, reward_mode="per_call", discount=0.0)
    assert trajectory is not None
    assert [row.returns for row in trajectory.rows] == [[0.0, 0.0], [1.0, 1.0]]


def test_per_call_mode_puts_an_explicit_reward_on_the_last_call() -> None:
    spans = Spans().call([1], [2]).call([1, 2, 3], [4]).spans
    trajectory, _ = build_trajectory(ROLLOUT, spans, reward=1.0, reward_mode="per_call", discount=0.5)
    assert trajectory is not None
    assert trajectory.reward == 1.0
    # call 1 return = 1.0; call 0 return = 0 + 0.5 * 1.0 (hand-computed)
    assert trajectory.rows[0].returns == [0.5, 0.5, 1.0, 1.0]


def test_a_call_with_an_empty_response_loses_nothing() -> None:
    """Nothing was sampled, so nothing is lost: counted apart, never as a drop or missing logprobs,
    and the call after it still merges exactly."""
    for with_logprobs in (True, False):
        spans = Spans().call([1], [2]).call([1, 2], [], with_logprobs=with_logprobs).call([1, 2, 3], [4])
        trajectory, report = build_trajectory(ROLLOUT, spans.reward(1.0).spans)
        assert trajectory is not None
        [row] = trajectory.rows
        assert row.token_ids == [1, 2, 3, 4]
        assert row.loss_mask == [0, 1, 0, 1]
        assert report.calls_empty_response == 1
        assert report.calls_trained == 2
        assert report.merge_breaks == 0
        assert losses(report) == {}
    alone, report = build_trajectory(ROLLOUT, Spans().call([1], []).reward(1.0).spans)
    assert alone is None
    assert report.calls_empty_response == 1
    assert report.rollouts_without_calls == 1
    assert losses(report) == {}


def test_a_failed_call_is_counted_apart_from_missing_ids() -> None:
    spans = Spans().failed().call([1], [2]).reward(1.0).spans
    trajectory, report = build_trajectory(ROLLOUT, spans)
    assert trajectory is not None
    assert [row.token_ids for row in trajectory.rows] == [[1, 2]]
    assert report.calls_failed == 1
    assert report.calls_missing_ids == 0
    assert losses(report) == {}
    assert "calls_failed" not in DriftReport.LOSSES
