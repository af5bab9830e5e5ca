"""Running a model's query on the company database without letting it change anything, and scoring it.

:func:`run_query` opens the file read-only for each call and installs an authorizer that allows
reading only: selecting, reading columns, calling functions (but not ``load_extension``) and
recursive CTEs. Every write, schema change, ATTACH, DETACH, PRAGMA and transaction statement is
refused before it runs. One statement per call, a time limit (a progress handler) and a row cap;
bad SQL never raises, it comes back as a :class:`QueryResult` with the error's text.

:func:`execution_accuracy` is the reward: the predicted query's rows against the gold query's, as a
multiset, or in order when the gold query orders its result at the top level.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["QueryResult", "execution_accuracy", "format_result", "has_top_level_order_by", "run_query"]

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_WRITES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_BLOCKED_FUNCTIONS = {"load_extension"}
_REFUSALS = {  # why a statement is refused, by its first word
    **dict.fromkeys(("insert", "update", "delete", "replace", "upsert"), "the query tries to write"),
    **dict.fromkeys(("create", "drop", "alter"), "the query tries to change the schema"),
    **dict.fromkeys(("attach", "detach"), "ATTACH and DETACH are not allowed"),
    "pragma": "PRAGMA is not allowed",
    **dict.fromkeys(
        ("begin", "commit", "end", "rollback", "savepoint", "release"),
        "transaction statements are not allowed",
    ),
}
_PROGRESS_STEPS = 1_000  # virtual-machine instructions between two looks at the clock
_MAX_VALUE_BYTES = 1_000_000  # no string or blob longer than this (randomblob(10**9) would allocate it)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


@dataclass(frozen=True)
class QueryResult:
    """A query's column names and rows, or why it gave none: exactly one of ``rows`` and ``error``."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...] | None
    error: str | None

    def __post_init__(self) -> None:
        if (self.rows is None) == (self.error is None):
            raise ValueError("a QueryResult has exactly one of rows and error")

    @property
    def ok(self) -> bool:
        return self.error is None


def _failed(error: str) -> QueryResult:
    return QueryResult(columns=(), rows=None, error=error)


def _mask(sql: str) -> str:
    """``sql`` of the same length with comments blanked out and each quoted string or identifier
    (quotes included) replaced by ``#``, so what is left shows the statement's own structure."""
    out = list(sql)
    index, size = 0, len(sql)
    while index < size:
        if sql.startswith("--", index):
            end = sql.find("\n", index)
            end, fill = (size if end < 0 else end), " "
        elif sql.startswith("/*", index):
            end = sql.find("*/", index + 2)
            end, fill = (size if end < 0 else end + 2), " "
        elif sql[index] in "'\"`[":
            end, fill = _quoted_end(sql, index), "#"
        else:
            index += 1
            continue
        out[index:end] = fill * (end - index)
        index = end
    return "".join(out)


def _quoted_end(sql: str, start: int) -> int:
    """Where the quoted string or identifier opening at ``start`` ends (a doubled quote is one
    quote inside it; an unclosed one runs to the end)."""
    close = "]" if sql[start] == "[" else sql[start]
    index = start + 1
    while True:
        index = sql.find(close, index)
        if index < 0:
            return len(sql)
        if close != "]" and sql.startswith(close * 2, index):
            index += 2
            continue
        return index + 1


def _top_level(masked: str) -> str:
    """``masked`` with everything inside parentheses blanked out."""
    depth, out = 0, []
    for char in masked:
        if char == "(":
            depth += 1
        out.append(char if depth == 0 else " ")
        if char == ")" and depth > 0:
            depth -= 1
    return "".join(out)


def has_top_level_order_by(sql: str) -> bool:
    """Whether the query orders its own result (not just a subquery's or a window's).

    >>> has_top_level_order_by("select name from t order by salary desc limit 3")
    True
    >>> has_top_level_order_by("select * from (select x from t order by x) where x > 'order by'")
    False
    """
    return _ORDER_BY.search(_top_level(_mask(sql))) is not None


def _single_statement(sql: str) -> str | None:
    """``sql`` without its trailing semicolons and comments, or None when it holds two statements.
    An empty string means there is no statement at all."""
    masked = _mask(sql)
    end = len(masked.rstrip())
    while end > 0 and masked[end - 1] == ";":
        end = len(masked[: end - 1].rstrip())
    if ";" in masked[:end]:
        return None
    return sql[:end].strip()


def _first_word(statement: str) -> str:
    match = re.match(r"\s*([A-Za-z]+)", _mask(statement))
    return match.group(1).lower() if match else ""


class _Guard:
    """The authorizer: allows reads, and says why it refused the first thing it refused."""

    def __init__(self) -> None:
        self.refusal: str | None = None

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None
    ) -> int:
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _BLOCKED_FUNCTIONS:
            self.refusal = self.refusal or f"refused: {arg2} is not allowed"
            return sqlite3.SQLITE_DENY
        if action in _ALLOWED:
            return sqlite3.SQLITE_OK
        writes = action in _WRITES and not (arg1 or "").startswith("sqlite_")
        self.refusal = self.refusal or (
            "refused: the query tries to write" if writes else "refused: only reads are allowed"
        )
        return sqlite3.SQLITE_DENY


def _message(error: Exception) -> str:
    text = str(error) or type(error).__name__
    if "syntax error" in text or "incomplete input" in text:
        return "syntax error: " + text.replace(": syntax error", "").replace("syntax error", "").strip(": ")
    return text


def run_query(
    db_path: str | Path, sql: str, *, timeout_seconds: float = 2.0, max_rows: int = 1000
) -> QueryResult:
    """Run one read-only statement on the database at ``db_path``: its first ``max_rows`` rows, or
    the error (refused, syntax, no such column, past the time limit...). Never raises for bad SQL.

    >>> run_query("/no/such.db", "").error
    'empty query'
    """
    statement = _single_statement(sql) if isinstance(sql, str) else ""
    if statement is None:
        return _failed("refused: one statement at a time")
    if not statement:
        return _failed("empty query")
    refusal = _REFUSALS.get(_first_word(statement))
    if refusal is not None:  # the authorizer would refuse it too; this says why in plain words
        return _failed(f"refused: {refusal}")
    try:
        uri = f"{Path(db_path).resolve().as_uri()}?mode=ro"
        connection = sqlite3.connect(uri, uri=True, timeout=timeout_seconds, isolation_level=None)
    except (sqlite3.Error, OSError, ValueError) as error:
        return _failed(f"cannot open the database: {error}")
    guard = _Guard()
    deadline = time.monotonic() + timeout_seconds
    timed_out = False

    def past_deadline() -> int:
        nonlocal timed_out
        timed_out = time.monotonic() > deadline
        return 1 if timed_out else 0

    try:
        if hasattr(connection, "enable_load_extension"):  # absent where Python's sqlite3 omits it
            connection.enable_load_extension(False)
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        connection.set_authorizer(guard)
        connection.set_progress_handler(past_deadline, _PROGRESS_STEPS)
        try:
            cursor = connection.execute(statement)
            rows = tuple(tuple(row) for row in cursor.fetchmany(max(max_rows, 0)))
        except Exception as error:  # bad SQL of any kind is an answer, not a crash
            if timed_out:
                return _failed(f"query ran past the {timeout_seconds} s limit")
            if guard.refusal is not None:
                return _failed(guard.refusal)
            return _failed(_message(error))
        columns = tuple(column[0] for column in cursor.description or ())
        return QueryResult(columns=columns, rows=rows, error=None)
    finally:
        connection.close()


def _normalized(rows: tuple[tuple[Any, ...], ...]) -> list[tuple[Any, ...]]:
    return [tuple(round(value, 6) if isinstance(value, float) else value for value in row) for row in rows]


def execution_accuracy(
    db_path: str | Path, predicted_sql: str, gold_sql: str, *, timeout_seconds: float = 2.0
) -> float:
    """1.0 when ``predicted_sql`` runs and gives the gold query's rows, else 0.0. Rows compare as a
    multiset, or in order when the gold query has a top-level ORDER BY; floats are rounded to six
    digits; column names do not matter. Raises ValueError when the gold query itself fails."""
    gold = run_query(db_path, gold_sql, timeout_seconds=timeout_seconds, max_rows=1_000_000)
    if gold.rows is None:
        raise ValueError(f"the gold query fails: {gold.error} ({gold_sql})")
    # One row more than gold's is enough to see that a prediction has too many.
    predicted = run_query(
        db_path, predicted_sql, timeout_seconds=timeout_seconds, max_rows=len(gold.rows) + 1
    )
    if predicted.rows is None:
        return 0.0
    want, got = _normalized(gold.rows), _normalized(predicted.rows)
    if has_top_level_order_by(gold_sql):
        return 1.0 if got == want else 0.0
    return 1.0 if Counter(got) == Counter(want) else 0.0


def _shown(value: Any) -> Any:
    return round(value, 2) if isinstance(value, float) else value


def format_result(result: QueryResult, max_rows: int = 5) -> str:
    """The result in a line for a prompt: the error, or how many rows and the first ``max_rows``.

    >>> format_result(QueryResult(columns=("n",), rows=((12,), (7,), (4,)), error=None))
    '3 rows: (12,) | (7,) | (4,)'
    >>> format_result(QueryResult(columns=(), rows=None, error="no such column: x"))
    'error: no such column: x'
    """
    if result.rows is None:
        return f"error: {result.error}"
    count = len(result.rows)
    head = f"{count} row" + ("" if count == 1 else "s")
    if not count:
        return head
    shown = [repr(tuple(_shown(value) for value in row)) for row in result.rows[:max_rows]]
    shown = [text if len(text) <= 200 else text[:197] + "..." for text in shown]
    if count > max_rows:
        shown.append("...")
    return f"{head}: " + " | ".join(shown)
