"""The text-to-SQL example's data side: the generated database, the question splits, and running and
scoring a model's query safely."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from examples.sql.database import SCHEMA, build_database, make_rows
from examples.sql.dataset import KINDS, TEMPLATES, distinct_pairs, make_splits
from examples.sql.execution import (
    QueryResult,
    execution_accuracy,
    format_result,
    has_top_level_order_by,
    run_query,
)

TABLES = ("departments", "employees", "projects", "assignments")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_database(tmp_path_factory.mktemp("sql") / "company.db")


def table_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    connection = sqlite3.connect(path)
    try:
        return {
            table: connection.execute(f"select * from {table} order by rowid").fetchall() for table in TABLES
        }
    finally:
        connection.close()


# -- the database ----------------------------------------------------------------------------------


def test_the_database_is_the_same_for_a_seed_and_differs_for_another(tmp_path: Path) -> None:
    first = table_rows(build_database(tmp_path / "a" / "company.db", seed=0))
    assert first == table_rows(build_database(tmp_path / "b" / "company.db", seed=0))
    assert first == make_rows(0)
    assert [len(first[table]) for table in TABLES] == [8, 120, 30, 300]
    other = table_rows(build_database(tmp_path / "c" / "company.db", seed=1))
    assert other != first


def test_the_schema_text_names_every_column_of_every_table(db: Path) -> None:
    connection = sqlite3.connect(db)
    try:
        lines = [
            f"{table}({', '.join(row[1] for row in connection.execute(f'pragma table_info({table})'))})"
            for table in TABLES
        ]
    finally:
        connection.close()
    assert "\n".join(lines) == SCHEMA


def test_salaries_and_budgets_never_tie(db: Path) -> None:
    rows = table_rows(db)
    assert len({row[4] for row in rows["employees"]}) == len(rows["employees"])
    assert len({row[3] for row in rows["projects"]}) == len(rows["projects"])


def test_a_database_that_holds_the_seed_is_reused_and_another_is_rewritten(tmp_path: Path) -> None:
    path = build_database(tmp_path / "company.db", seed=0)
    before = path.stat()
    assert build_database(path, seed=0) == path
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    build_database(path, seed=2)
    assert path.stat().st_ino != before.st_ino  # replaced by a new file
    assert table_rows(path) == make_rows(2)
    path.write_bytes(b"not a database")
    assert table_rows(build_database(path, seed=2)) == make_rows(2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["company.db"]  # no temporary file left


# -- the splits ------------------------------------------------------------------------------------


def pair(task: dict[str, Any]) -> tuple[str, tuple[tuple[str, Any], ...]]:
    return task["template"], tuple(sorted(task["constants"].items()))


def test_splits_are_deterministic_and_never_share_a_pair() -> None:
    splits = make_splits(seed=3)
    assert [len(splits[name]) for name in ("train", "val", "test")] == [400, 64, 128]
    assert make_splits(seed=3) == splits
    assert make_splits(seed=4) != splits
    pairs = {name: {pair(task) for task in tasks} for name, tasks in splits.items()}
    assert sum(len(p) for p in pairs.values()) == 400 + 64 + 128  # no pair twice, even within a split
    assert not pairs["train"] & pairs["val"]
    assert not pairs["train"] & pairs["test"]
    assert not pairs["val"] & pairs["test"]
    tasks = [task for split in splits.values() for task in split]
    assert len({task["id"] for task in tasks}) == len(tasks)
    assert {task["template"] for task in tasks} == set(TEMPLATES)
    assert {task["kind"] for task in tasks} == set(KINDS)
    assert 12 <= len(TEMPLATES) <= 16
    for task in tasks:
        assert set(task) == {"id", "question", "gold_sql", "template", "kind", "constants"}
        question = task["question"].lower()
        for name, value in task["constants"].items():
            assert (f"{value:,}" if name == "salary" else str(value).lower()) in question, task


def test_every_template_is_asked_in_several_ways() -> None:
    splits = make_splits(sizes=(distinct_pairs(), 0, 0))
    shapes: dict[str, set[str]] = {}
    for task in splits["train"]:
        shape = task["question"]
        for value in task["constants"].values():
            shape = shape.replace(f"{value:,}" if isinstance(value, int) else str(value), "_")
        shapes.setdefault(task["template"], set()).add(shape.split()[0])
    assert all(len(first_words) >= 2 for first_words in shapes.values()), shapes


def test_sizes_beyond_the_distinct_pairs_are_refused_clearly() -> None:
    available = distinct_pairs()
    assert available >= 400 + 64 + 128
    assert len(make_splits(sizes=(available - 2, 1, 1))["train"]) == available - 2
    with pytest.raises(ValueError, match=rf"ask for {available + 1} distinct .* only {available}"):
        make_splits(sizes=(available, 1, 0))
    with pytest.raises(ValueError, match="three counts"):
        make_splits(sizes=(10, -1, 0))


def test_every_gold_query_gives_a_useful_answer(db: Path) -> None:
    for task in make_splits(sizes=(distinct_pairs(), 0, 0))["train"]:
        result = run_query(db, task["gold_sql"])
        assert result.rows, task
        assert result.rows not in (((0,),), ((None,),)), task
        if task["kind"] == "top":
            assert len(result.rows) == task["constants"]["n"]
            assert has_top_level_order_by(task["gold_sql"])
        else:
            assert not has_top_level_order_by(task["gold_sql"])


# -- running a query -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "insert into departments values (99, 'Mail', 'Rome')",
        "update employees set salary = 0",
        "delete from employees",
        "drop table employees",
        "create table notes (text)",
        "with x as (select 1) delete from assignments",
        "attach database 'other.db' as other",
        "detach database main",
        "pragma user_version = 7",
        "pragma table_info(employees)",
        "select * from pragma_table_info('employees')",
        "select load_extension('x')",
        "begin",
        "vacuum",
        "select 1; select 2",
        "select 1; drop table employees",
    ],
)
def test_anything_but_a_single_read_is_refused(db: Path, sql: str) -> None:
    before = db.read_bytes()
    result = run_query(db, sql)
    assert not result.ok
    assert result.rows is None
    assert result.error is not None
    assert result.error.startswith("refused: "), result.error
    assert db.read_bytes() == before
    assert not (db.parent / "other.db").exists()


def test_refusals_say_why(db: Path) -> None:
    assert run_query(db, "delete from employees").error == "refused: the query tries to write"
    assert run_query(db, "select 1; select 2").error == "refused: one statement at a time"
    assert run_query(db, "pragma user_version").error == "refused: PRAGMA is not allowed"


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("selec name from employees", 'syntax error: near "selec"'),
        ("select name from employees where", "syntax error: incomplete input"),
        ("select nickname from employees", "no such column: nickname"),
        ("select * from staff", "no such table: staff"),
        ("", "empty query"),
        (" ; -- nothing", "empty query"),
    ],
)
def test_bad_sql_comes_back_as_an_error(db: Path, sql: str, error: str) -> None:
    assert run_query(db, sql) == QueryResult(columns=(), rows=None, error=error)


def test_a_slow_query_stops_at_the_limit(db: Path) -> None:
    sql = (
        "with recursive n(x) as (select 1 union all select x + 1 from n where x < 1000000000)"
        " select count(*) from n"
    )
    started = time.monotonic()
    result = run_query(db, sql, timeout_seconds=0.2)
    assert result.error == "query ran past the 0.2 s limit"
    assert time.monotonic() - started < 1.5


def test_a_good_query_gives_columns_and_capped_rows(db: Path) -> None:
    result = run_query(db, "select count(*) as n from employees;  ")
    assert result.ok
    assert (result.columns, result.rows) == (("n",), ((120,),))
    assert run_query(db, "select 'a;b' -- one statement;\n;").rows == (("a;b",),)
    capped = run_query(db, "select e.id, f.id from employees e, employees f", max_rows=7)
    assert capped.rows is not None
    assert len(capped.rows) == 7


def test_a_missing_database_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    result = run_query(tmp_path / "absent.db", "select 1")
    assert result.error is not None
    assert result.error.startswith("cannot open the database")
    assert not (tmp_path / "absent.db").exists()


def test_a_result_has_rows_or_an_error() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        QueryResult(columns=(), rows=None, error=None)
    with pytest.raises(ValueError, match="exactly one"):
        QueryResult(columns=(), rows=(), error="x")


# -- scoring ---------------------------------------------------------------------------------------

SALES = "select e.name from employees e join departments d on e.department_id = d.id where d.name = 'Sales'"
TOP = SALES + " order by e.salary desc limit 3"


def test_unordered_gold_compares_rows_as_a_multiset(db: Path) -> None:
    assert execution_accuracy(db, SALES, SALES) == 1.0
    reordered = "select name as who from employees where department_id = 1 order by name desc"
    assert execution_accuracy(db, reordered, SALES) == 1.0
    doubled = f"{SALES} union all {SALES}"
    assert execution_accuracy(db, doubled, SALES) == 0.0
    assert execution_accuracy(db, "select name from employees where department_id = 2", SALES) == 0.0
    assert execution_accuracy(db, "select name from employees", SALES) == 0.0
    assert execution_accuracy(db, "select e.id from employees e where department_id = 1", SALES) == 0.0


def test_ordered_gold_needs_the_order(db: Path) -> None:
    right = "select name from employees where department_id = 1 order by salary desc limit 3"
    assert execution_accuracy(db, right, TOP) == 1.0
    backwards = (
        "select name from (select e.name, e.salary from employees e where e.department_id = 1"
        " order by e.salary desc limit 3) order by salary"
    )
    names, backwards_rows = run_query(db, TOP).rows, run_query(db, backwards).rows
    assert names is not None
    assert backwards_rows is not None
    assert sorted(backwards_rows) == sorted(names)
    assert backwards_rows != names
    assert execution_accuracy(db, backwards, TOP) == 0.0
    assert execution_accuracy(db, right.replace("desc", "asc"), TOP) == 0.0


def test_floats_match_to_six_digits_and_failures_score_zero(db: Path) -> None:
    gold = "select avg(salary) from employees where title = 'Engineer'"
    by_hand = "select sum(salary) * 1.0 / count(*) from employees where title = 'Engineer'"
    assert execution_accuracy(db, by_hand, gold) == 1.0
    assert (
        execution_accuracy(db, "select avg(salary) + 0.001 from employees where title = 'Engineer'", gold)
        == 0.0
    )
    assert execution_accuracy(db, "select avg(pay) from employees", gold) == 0.0
    assert execution_accuracy(db, "delete from employees", gold) == 0.0
    assert execution_accuracy(db, "", gold) == 0.0
    slow = "with recursive n(x) as (select 1 union all select x + 1 from n) select count(*) from n"
    assert execution_accuracy(db, slow, gold, timeout_seconds=0.1) == 0.0
    with pytest.raises(ValueError, match="gold query fails"):
        execution_accuracy(db, gold, "select nope from employees")


def test_top_level_order_by_ignores_subqueries_strings_and_windows() -> None:
    assert has_top_level_order_by("SELECT name FROM t ORDER\n BY x")
    assert has_top_level_order_by("select a from t union select b from u order by 1")
    assert not has_top_level_order_by("select * from (select x from t order by x)")
    assert not has_top_level_order_by("select row_number() over (order by x) from t")
    assert not has_top_level_order_by("select 'order by' from t -- order by x")


def test_results_are_shown_briefly() -> None:
    assert (
        format_result(QueryResult(columns=(), rows=None, error="no such table: x"))
        == "error: no such table: x"
    )
    assert format_result(QueryResult(columns=("n",), rows=((12,),), error=None)) == "1 row: (12,)"
    assert format_result(QueryResult(columns=("n",), rows=(), error=None)) == "0 rows"
    rows = tuple((i, 0.123456) for i in range(7))
    text = format_result(QueryResult(columns=("i", "x"), rows=rows, error=None))
    assert text == "7 rows: (0, 0.12) | (1, 0.12) | (2, 0.12) | (3, 0.12) | (4, 0.12) | ..."
    assert format_result(QueryResult(columns=("i", "x"), rows=rows, error=None), max_rows=2).count("|") == 2
