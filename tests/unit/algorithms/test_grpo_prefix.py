"""Which rows share which prefix, and how a batch is scheduled around them (no model needed)."""

from __future__ import annotations

from fulgor.algorithms.grpo.prefix import MIN_SHARED_TOKENS, plan, schedule

A = list(range(100, 120))  # 20 tokens
B = list(range(200, 230))  # 30
C = list(range(300, 318))  # 18
ROWS = [[*A, 1], [*A, 1, 2, 3, 4], [*A, 5, 5], [*B, 1, 2], [*B, 3], [*C, 1, 2, 3], [*C, 4], [7, 8, 9]]


def last(rows: list[list[int]]) -> list[int]:
    """No row's loss reads a hidden state before its last token's."""
    return [len(row) - 1 for row in rows]


def test_plan_groups_rows_that_begin_alike_up_to_each_rows_limit() -> None:
    rows = ROWS[:5] + ROWS[7:]
    limits = last(rows)
    limits[1] = 18  # row 1's loss reads position 18: its group's prefix stops there
    shared = plan(rows, limits)
    assert shared is not None
    assert shared.prefix_lengths == [18, 30]  # A's rows (A + [1] keeps its last token), B's rows
    assert shared.group == [0, 0, 0, 1, 1, 0]
    assert shared.shared == [18, 18, 18, 30, 30, 0]  # [7, 8, 9] shares nothing


def test_too_short_a_common_prefix_is_not_shared() -> None:
    short = A[: MIN_SHARED_TOKENS - 1]
    assert plan([[*short, 1], [*short, 2]], [15, 15]) is None
    assert plan([[*A, 1], [*A, 2]], [3, 20]) is None  # row 0's loss reads from position 3


def test_schedule_computes_up_to_a_micro_batch_of_prefixes_per_wave() -> None:
    waves = schedule(ROWS, last(ROWS), 2)
    # The two longest prefixes (B, A) in one wave, their rows sorted by what follows the prefix
    # (4, 2, 2, 1, 1 tokens); then C's; the row that shares nothing last, without a plan.
    assert [wave.parts for wave in waves] == [[[1, 2], [3, 0], [4]], [[5, 6]], [[7]]]
    assert [wave.rows for wave in waves] == [[0, 1, 2, 3, 4], [5, 6], []]
    plans = [wave.plan for wave in waves]
    assert plans[0] is not None
    assert plans[0].prefix_lengths == [30, 20]  # the longest first
    assert plans[1] is not None
    assert plans[1].shared == [18, 18]
    assert plans[2] is None


def test_without_shared_prefixes_the_schedule_is_the_length_order() -> None:
    rows = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 8, 9, 10], [5, 6, 7], [5, 6, 9, 9]]
    (wave,) = schedule(rows, last(rows), 2)
    assert wave.parts == [[1, 2], [0, 4], [3]]
    assert wave.plan is None
