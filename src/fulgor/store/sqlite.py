"""SqliteStore: the embedded, durable default store: one SQLite file in the run directory.

Durability: the file is in WAL mode and every operation commits before it returns, so a write
that was acknowledged survives the process being killed. ``synchronous="NORMAL"`` (the default)
may lose the last commits on an operating-system crash or power loss; ``"FULL"`` fsyncs every
commit and survives those too, at a cost in throughput (see benchmarks/store.py).

Several processes on one machine may open the same file: every write runs in a ``BEGIN
IMMEDIATE`` transaction, so a claim gives each rollout to exactly one worker. In-process waiters
are woken by events; changes made by other processes are noticed by a cheap
``PRAGMA data_version`` check every ``cross_process_seconds`` while waiting.

What it does not know: HTTP, agents, training. Operations run on the caller's thread and hold
the connection briefly; the file is the only shared state.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from fulgor import semconv
from fulgor.errors import (
    ConfigError,
    FulgorError,
    NotFoundError,
    StoreUnavailableError,
    ValidationError,
)
from fulgor.limits import quoted
from fulgor.store import _rules as rules
from fulgor.store._rows import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    WORKER_COLUMNS,
    attempt_from_row,
    attempt_row,
    rollout_from_row,
    rollout_row,
    worker_from_row,
)
from fulgor.store.base import LATEST, SpanList
from fulgor.store.validated import ValidatedStore
from fulgor.types import (
    ROLLOUT_QUEUED_STATUSES,
    ROLLOUT_TERMINAL_STATUSES,
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    JsonDict,
    Resources,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutRequest,
    Span,
    StoreStats,
    Worker,
)

__all__ = ["SqliteStore"]

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL UNIQUE,
    queue_seq INTEGER,
    status TEXT NOT NULL,
    mode TEXT NOT NULL,
    group_id TEXT,
    resources_id TEXT,
    input TEXT NOT NULL,
    config TEXT NOT NULL,
    metadata TEXT NOT NULL,
    enqueue_time REAL NOT NULL,
    start_time REAL,
    end_time REAL,
    attempt_count INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rollouts_queue ON rollouts(queue_seq) WHERE queue_seq IS NOT NULL;
CREATE INDEX IF NOT EXISTS rollouts_group ON rollouts(group_id) WHERE group_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    sequence_id INTEGER NOT NULL,
    worker_id TEXT,
    status TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL,
    last_active_time REAL NOT NULL,
    error TEXT,
    metadata TEXT NOT NULL,
    timeout_at REAL,
    silence_seconds REAL,
    span_count INTEGER NOT NULL DEFAULT 0,
    UNIQUE (rollout_id, sequence_id)
);
CREATE INDEX IF NOT EXISTS attempts_live ON attempts(worker_id)
    WHERE status IN ('preparing', 'running');
CREATE TABLE IF NOT EXISTS spans (
    rollout_id TEXT NOT NULL,
    attempt_seq INTEGER NOT NULL,
    attempt_id TEXT NOT NULL,
    sequence_id INTEGER NOT NULL,
    span_id TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (rollout_id, attempt_seq, sequence_id),
    UNIQUE (attempt_id, span_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS resources (
    resources_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL UNIQUE,
    body TEXT NOT NULL
);
-- What the dashboard filters and sorts rollouts by, kept as spans arrive: each rollout's latest
-- reward and the agents its spans name (see fulgor.dashboard).
CREATE TABLE IF NOT EXISTS rollout_rewards (
    seq INTEGER PRIMARY KEY,
    reward REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rollout_rewards_reward ON rollout_rewards(reward, seq);
CREATE TABLE IF NOT EXISTS rollout_agents (
    agent_name TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (agent_name, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rollouts_status_seq ON rollouts(status, seq);
CREATE INDEX IF NOT EXISTS rollouts_mode_seq ON rollouts(mode, seq);
CREATE INDEX IF NOT EXISTS rollouts_resources_seq ON rollouts(resources_id, seq);
CREATE INDEX IF NOT EXISTS rollouts_step_seq ON rollouts(json_extract(metadata, '$.step'), seq);
CREATE INDEX IF NOT EXISTS attempts_status ON attempts(status, rollout_id);
CREATE TABLE IF NOT EXISTS workers (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    worker_id TEXT NOT NULL UNIQUE,
    first_seen_time REAL NOT NULL,
    last_heartbeat_time REAL NOT NULL,
    stats TEXT NOT NULL
);
"""

# 1: rollout_rewards and rollout_agents (filled from the spans already stored when a store is upgraded).
_SCHEMA_VERSION = 1
_LIVE = "status IN ('preparing', 'running')"
_SWEEP_INTERVAL_SECONDS = 0.005
# Live attempts past their timeout or silence deadline; the partial index attempts_live keeps it cheap.
_OVERDUE = f"{_LIVE} AND (timeout_at <= :now OR last_active_time + silence_seconds <= :now)"


class SqliteStore(ValidatedStore):
    """Durable store in one SQLite file; see :class:`fulgor.store.base.Store` for the contract."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_seconds: float = 30.0,
        cross_process_seconds: float = 0.2,
        checkpoint_seconds: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValidationError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            folder = self.path.parent
            raise ConfigError(f"cannot create the store's folder {folder}: {error.strerror}") from None
        self._clock = clock
        self._cross_process_seconds = cross_process_seconds
        self._lock = threading.RLock()
        self._signal = rules.ChangeSignal()
        self._closed = False
        self._last_sweep = -math.inf
        self._open(synchronous, busy_timeout_seconds)
        self._checkpointer = _Checkpointer(self.path, checkpoint_seconds, busy_timeout_seconds)

    # -- rollouts ---------------------------------------------------------------------------------

    async def _enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        self._sweep()
        now = self._clock()
        created = [rules.rollout_from_request(request, now) for request in requests]
        with self._write():
            queue_seq = self._next_queue_seq()
            self._conn.executemany(
                f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}, queue_seq) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [(*rollout_row(rollout), queue_seq + i) for i, rollout in enumerate(created)],
            )
        if created:
            self._signal.notify()
        return created

    async def _start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout:
        self._sweep()
        rollout = rules.rollout_from_request(request, self._clock())
        with self._write():
            self._conn.execute(
                f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                rollout_row(rollout),
            )
            return self._begin(rollout, worker_id)

    async def _claim(self, worker_id: str, limit: int, wait_seconds: float) -> list[AttemptedRollout]:
        async def claim_once() -> list[AttemptedRollout] | None:
            return self._claim_now(worker_id, limit) or None

        claimed = await rules.wait_for_result(
            claim_once, self._signal, wait_seconds, self._seconds_to_deadline, self._cross_process_seconds
        )
        return claimed or []

    async def _get_rollout(self, rollout_id: str) -> Rollout:
        self._sweep()
        return self._rollout(rollout_id)

    async def _query_rollouts(
        self,
        statuses: frozenset[str] | None,
        group_id: str | None,
        mode: RolloutMode | None,
        limit: int | None,
        offset: int,
        order: Literal["asc", "desc"],
    ) -> list[Rollout]:
        self._sweep()
        clauses: list[str] = []
        params: list[Any] = []
        if statuses is not None:
            clauses.append(f"status IN ({','.join('?' * len(statuses))})")
            params.extend(sorted(statuses))
        if group_id is not None:
            clauses.append("group_id = ?")
            params.append(group_id)
        if mode is not None:
            clauses.append("mode = ?")
            params.append(mode)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        direction = "DESC" if order == "desc" else "ASC"
        params.extend([-1 if limit is None else limit, offset])
        rows = self._read(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts {where} ORDER BY seq {direction} LIMIT ? OFFSET ?",
            params,
        )
        return [rollout_from_row(row) for row in rows]

    async def _cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        self._sweep()
        now = self._clock()
        with self._write():
            rollouts = [self._rollout(rollout_id) for rollout_id in rollout_ids]
            rules.check_cancellable(rollouts)
            result = [
                rollout if rollout.status == "cancelled" else self._cancel_one(rollout, now)
                for rollout in rollouts
            ]
        self._signal.notify()
        return result

    async def _start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout:
        self._sweep()
        with self._write():
            return self._begin(self._rollout(rollout_id), worker_id)

    # -- attempts ---------------------------------------------------------------------------------

    async def _update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | None,
        error: str | None,
        metadata: JsonDict | None,
    ) -> Attempt:
        self._sweep()
        now = self._clock()
        with self._write():
            attempt = self._attempt(rollout_id, attempt_id)
            updated = rules.updated_attempt(attempt, now, status=status, error=error, metadata=metadata)
            changed = self._put_attempt(updated, now)
        if changed:
            self._signal.notify()
        return updated

    async def _list_attempts(self, rollout_id: str) -> list[Attempt]:
        self._sweep()
        self._rollout(rollout_id)
        rows = self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? ORDER BY sequence_id",
            (rollout_id,),
        )
        return [attempt_from_row(row) for row in rows]

    # -- spans ------------------------------------------------------------------------------------

    async def _add_spans(self, spans: Sequence[Span]) -> list[Span]:
        self._sweep()
        now = self._clock()
        changed = False
        with self._write():
            keys = dict.fromkeys((span.rollout_id, span.attempt_id) for span in spans)
            attempts = {key: self._span_target(*key) for key in keys}
            counts = {key: count for key, (_, _, count) in attempts.items()}
            stored = [
                self._store_span(span, attempts[key][0], counts, key)
                for span in spans
                for key in [(span.rollout_id, span.attempt_id)]
            ]
            for key, (_, status, _) in attempts.items():
                if status == "preparing":
                    attempt = self._attempt(*key)
                    running = attempt.model_copy(update={"status": "running", "last_active_time": now})
                    changed = self._put_attempt(running, now) or changed
                # Live or not, one statement: the span count, and activity for a live attempt.
                self._conn.execute(
                    f"UPDATE attempts SET span_count = ?, last_active_time = "
                    f"CASE WHEN {_LIVE} THEN ? ELSE last_active_time END WHERE attempt_id = ?",
                    (counts[key], now, key[1]),
                )
        if changed:
            self._signal.notify()
        return stored

    def _store_span(
        self, span: Span, attempt_seq: int, counts: dict[tuple[str, str], int], key: tuple[str, str]
    ) -> Span:
        """Insert a span with the next sequence id, or return the one its span_id already names."""
        candidate = span.model_copy(update={"sequence_id": counts[key] + 1})
        cursor = self._conn.execute(
            "INSERT OR IGNORE INTO spans "
            "(rollout_id, attempt_seq, attempt_id, sequence_id, span_id, name, body) VALUES (?,?,?,?,?,?,?)",
            (
                span.rollout_id,
                attempt_seq,
                span.attempt_id,
                candidate.sequence_id,
                span.span_id,
                span.name,
                candidate.model_dump_json(),
            ),
        )
        if cursor.rowcount == 1:
            counts[key] += 1
            self._index_span(candidate)
            return candidate
        row = self._conn.execute(
            "SELECT body, sequence_id FROM spans WHERE attempt_id = ? AND span_id = ?",
            (span.attempt_id, span.span_id),
        ).fetchone()
        return rules.stored_span(row[0], row[1], span)

    def _index_span(self, span: Span) -> None:
        """Keep ``rollout_rewards`` and ``rollout_agents`` up to date with a newly stored span."""
        reward, agent = rules.span_facts(span)
        if reward is None and agent is None:
            return
        (seq,) = self._conn.execute(
            "SELECT seq FROM rollouts WHERE rollout_id = ?", (span.rollout_id,)
        ).fetchone()
        if reward is not None:
            self._conn.execute(
                "INSERT INTO rollout_rewards (seq, reward) VALUES (?, ?) "
                "ON CONFLICT (seq) DO UPDATE SET reward = excluded.reward",
                (seq, reward),
            )
        if agent is not None:
            self._conn.execute(
                "INSERT OR IGNORE INTO rollout_agents (agent_name, seq) VALUES (?, ?)", (agent, seq)
            )

    async def _query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None,
        name: str | None,
        limit: int | None,
        offset: int,
    ) -> SpanList:
        self._sweep()
        rollout = self._rollout(rollout_id)
        clauses = ["rollout_id = ?"]
        params: list[Any] = [rollout_id]
        if attempt_id == LATEST:
            clauses.append("attempt_seq = ?")
            params.append(rollout.attempt_count)
        elif attempt_id is not None:
            clauses.append("attempt_seq = ?")
            params.append(self._attempt(rollout_id, attempt_id).sequence_id)
        if name is not None:
            clauses.append("name = ?")
            params.append(name)
        params.extend([-1 if limit is None else limit, offset])
        rows = self._read(
            f"SELECT body FROM spans WHERE {' AND '.join(clauses)} "
            "ORDER BY attempt_seq, sequence_id LIMIT ? OFFSET ?",
            params,
        )
        return rules.read_spans(row[0] for row in rows)

    # -- resources --------------------------------------------------------------------------------

    async def _put_resources(self, resources: Resources, resources_id: str | None) -> ResourcesVersion:
        with self._write():
            (version,) = self._conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()
            stored = rules.resources_version(resources, resources_id, version, self._clock())
            self._conn.execute(
                "INSERT OR REPLACE INTO resources (resources_id, version, body) VALUES (?, ?, ?)",
                (stored.resources_id, version, stored.model_dump_json()),
            )
        return stored

    async def _get_resources(self, resources_id: str | None) -> ResourcesVersion | None:
        if resources_id is None:
            rows = self._read("SELECT body FROM resources ORDER BY version DESC LIMIT 1", ())
            return ResourcesVersion.model_validate_json(rows[0][0]) if rows else None
        rows = self._read("SELECT body FROM resources WHERE resources_id = ?", (resources_id,))
        if not rows:
            raise NotFoundError(f"resources {quoted(resources_id)} not found")
        return ResourcesVersion.model_validate_json(rows[0][0])

    # -- workers, waiting, stats -------------------------------------------------------------------

    async def _heartbeat(
        self, worker_id: str, stats: JsonDict | None, attempt_ids: Sequence[str] | None
    ) -> Worker:
        self._sweep()
        now = self._clock()
        sql = f"UPDATE attempts SET last_active_time = ? WHERE worker_id = ? AND {_LIVE}"
        params: tuple[Any, ...] = (now, worker_id)
        if attempt_ids is not None:
            # One parameter however many ids (SQLite caps the number of parameters).
            sql += " AND attempt_id IN (SELECT value FROM json_each(?))"
            params += (json.dumps(list(attempt_ids)),)
        with self._write():
            worker = self._see_worker(worker_id, now, stats)
            self._conn.execute(sql, params)
        return worker

    async def _list_workers(self) -> list[Worker]:
        rows = self._read(f"SELECT {WORKER_COLUMNS} FROM workers ORDER BY seq", ())
        return [worker_from_row(row) for row in rows]

    async def _wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        for rollout_id in rollout_ids:
            self._rollout(rollout_id)

        def terminal() -> list[Rollout]:
            self._sweep()
            rollouts = [self._rollout(rollout_id) for rollout_id in rollout_ids]
            return [rollout for rollout in rollouts if rollout.status in ROLLOUT_TERMINAL_STATUSES]

        async def all_done() -> list[Rollout] | None:
            done = terminal()
            return done if len(done) == len(rollout_ids) else None

        done = await rules.wait_for_result(
            all_done, self._signal, timeout_seconds, self._seconds_to_deadline, self._cross_process_seconds
        )
        return done if done is not None else terminal()

    async def _stats(self) -> StoreStats:
        self._sweep()
        with self._lock:
            self._check_open()
            self._conn.execute("BEGIN")
            try:
                rollouts = dict(
                    self._conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall()
                )
                attempts = dict(
                    self._conn.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status").fetchall()
                )
                (spans,) = self._conn.execute("SELECT COUNT(*) FROM spans").fetchone()
                (workers,) = self._conn.execute("SELECT COUNT(*) FROM workers").fetchone()
                (versions,) = self._conn.execute("SELECT COUNT(*) FROM resources").fetchone()
            finally:
                self._conn.execute("COMMIT")
        return StoreStats(
            rollouts=rollouts, attempts=attempts, spans=spans, workers=workers, resources_versions=versions
        )

    async def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
                self._checkpointer.close()
        self._signal.notify()

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValidationError("the store is closed; open a new one")

    def _open(self, synchronous: str, busy_timeout_seconds: float) -> None:
        """Open ``self._conn`` in WAL mode and create the schema; ConfigError when the file is no store,
        StoreUnavailableError when another process keeps it locked past the busy timeout."""
        try:
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_seconds
            )
        except sqlite3.Error as error:
            raise self._open_error(error) from None
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            self._conn.execute("PRAGMA foreign_keys=OFF")
            self._conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer thread does it instead
            with self._write():
                self._create_schema()
        except sqlite3.Error as error:
            self._conn.close()
            raise self._open_error(error) from None
        except BaseException:
            self._conn.close()
            raise

    def _open_error(self, error: sqlite3.Error) -> FulgorError:
        if isinstance(error, sqlite3.OperationalError) and ("locked" in str(error) or "busy" in str(error)):
            return StoreUnavailableError(
                f"the store file {self.path} stayed locked by another process while opening ({error}); "
                "try again, or raise busy_timeout_seconds"
            )
        return ConfigError(
            f"cannot open the store file {self.path} ({error}): name a fulgor SQLite store "
            "(sqlite:///PATH), or a new file to create one, in a folder you can write to"
        )

    def _create_schema(self) -> None:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                self._conn.execute(statement)
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        if version < _SCHEMA_VERSION:
            self._index_stored_spans()
            self._conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")

    def _index_stored_spans(self) -> None:
        """Fill ``rollout_rewards`` and ``rollout_agents`` from the spans a store written before
        they existed holds (once, when such a store is first opened)."""
        names = " OR ".join("instr(body, ?) > 0" for _ in semconv.AGENT_NAME_ATTRIBUTES)
        rows = self._conn.execute(
            f"SELECT body FROM spans WHERE name IN (?, ?) OR {names} "
            "ORDER BY rollout_id, attempt_seq, sequence_id",
            (semconv.SPAN_REWARD, semconv.SPAN_MODEL_CALL, *semconv.AGENT_NAME_ATTRIBUTES),
        )
        for (body,) in rows.fetchall():
            for span in rules.read_spans([body]):
                self._index_span(span)

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One ``BEGIN IMMEDIATE`` transaction: everything inside commits together or not at all."""
        with self._lock:
            self._check_open()
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:  # another process held the file's write lock
                raise StoreUnavailableError(
                    f"the store file {self.path} stayed locked by another writer ({error}); try again, "
                    "or raise busy_timeout_seconds"
                ) from error
            try:
                yield
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with self._lock:
            self._check_open()
            return self._conn.execute(sql, params).fetchall()

    def _rollout(self, rollout_id: str) -> Rollout:
        rows = self._read(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,))
        if not rows:
            raise NotFoundError(f"rollout {quoted(rollout_id)} not found")
        return rollout_from_row(rows[0])

    def _attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        rows = self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ? AND rollout_id = ?",
            (attempt_id, rollout_id),
        )
        if not rows:
            self._rollout(rollout_id)
            raise NotFoundError(f"attempt {quoted(attempt_id)} of rollout {quoted(rollout_id)} not found")
        return attempt_from_row(rows[0])

    def _next_queue_seq(self) -> int:
        (value,) = self._conn.execute("SELECT COALESCE(MAX(queue_seq), 0) + 1 FROM rollouts").fetchone()
        return int(value)

    def _claim_now(self, worker_id: str, limit: int) -> list[AttemptedRollout]:
        self._sweep()
        with self._lock:
            if not self._conn.execute(
                "SELECT 1 FROM rollouts WHERE queue_seq IS NOT NULL LIMIT 1"
            ).fetchone():
                return []
            with self._write():
                rows = self._conn.execute(
                    f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE queue_seq IS NOT NULL "
                    "ORDER BY queue_seq LIMIT ?",
                    (limit,),
                ).fetchall()
                claimed = [self._begin(rollout_from_row(row), worker_id) for row in rows]
                if claimed:
                    self._see_worker(worker_id, self._clock(), None)
                return claimed

    def _begin(self, rollout: Rollout, worker_id: str) -> AttemptedRollout:
        """Start an attempt; runs inside a write transaction."""
        now = self._clock()
        latest = self._conn.execute(
            "SELECT resources_id FROM resources ORDER BY version DESC LIMIT 1"
        ).fetchone()
        rollout, attempt = rules.begin_attempt(rollout, worker_id, now, latest[0] if latest else None)
        timeout = rollout.config.timeout_seconds
        timeout_at = None if timeout is None else attempt.start_time + timeout
        self._conn.execute(
            "UPDATE rollouts SET status = ?, attempt_count = ?, start_time = ?, resources_id = ?, "
            "queue_seq = NULL WHERE rollout_id = ?",
            (
                rollout.status,
                rollout.attempt_count,
                rollout.start_time,
                rollout.resources_id,
                rollout.rollout_id,
            ),
        )
        self._conn.execute(
            f"INSERT INTO attempts ({ATTEMPT_COLUMNS}, timeout_at, silence_seconds) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (*attempt_row(attempt), timeout_at, rollout.config.unresponsive_seconds),
        )
        if rules.watchdog_deadline(attempt, rollout.config) is not None:
            # Waiting calls sleep until the next deadline: this one may be sooner. They read after
            # this transaction commits (reads wait for the store's lock).
            self._signal.notify()
        return rules.attempted(rollout, attempt)

    def _put_attempt(self, attempt: Attempt, now: float) -> bool:
        """Store a changed attempt and move its rollout along; True when a rollout status changed."""
        rollout = self._rollout(attempt.rollout_id)
        self._conn.execute(
            "UPDATE attempts SET status = ?, end_time = ?, last_active_time = ?, error = ?, metadata = ? "
            "WHERE attempt_id = ?",
            (
                attempt.status,
                attempt.end_time,
                attempt.last_active_time,
                attempt.error,
                json.dumps(attempt.metadata),
                attempt.attempt_id,
            ),
        )
        if attempt.sequence_id != rollout.attempt_count or rollout.status in ROLLOUT_TERMINAL_STATUSES:
            return False
        updated = rules.rollout_after_attempt(rollout, attempt, now)
        if updated.status == rollout.status:
            return False
        queue_seq = self._next_queue_seq() if updated.status in ROLLOUT_QUEUED_STATUSES else None
        self._conn.execute(
            "UPDATE rollouts SET status = ?, end_time = ?, queue_seq = ? WHERE rollout_id = ?",
            (updated.status, updated.end_time, queue_seq, updated.rollout_id),
        )
        return True

    def _span_target(self, rollout_id: str, attempt_id: str) -> tuple[int, str, int]:
        """The attempt's sequence id, status and span count (all ``add_spans`` needs to read)."""
        row = self._conn.execute(
            "SELECT sequence_id, status, span_count FROM attempts WHERE attempt_id = ? AND rollout_id = ?",
            (attempt_id, rollout_id),
        ).fetchone()
        if row is None:
            self._rollout(rollout_id)
            raise NotFoundError(f"attempt {quoted(attempt_id)} of rollout {quoted(rollout_id)} not found")
        return int(row[0]), str(row[1]), int(row[2])

    def _cancel_one(self, rollout: Rollout, now: float) -> Rollout:
        rows = self._conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? AND {_LIVE}",
            (rollout.rollout_id,),
        ).fetchall()
        for row in rows:
            ended = rules.move_attempt(attempt_from_row(row), "failed", now, "cancelled")
            self._conn.execute(
                "UPDATE attempts SET status = ?, end_time = ?, error = ? WHERE attempt_id = ?",
                (ended.status, ended.end_time, ended.error, ended.attempt_id),
            )
        cancelled = rollout.model_copy(update={"status": "cancelled", "end_time": now})
        self._conn.execute(
            "UPDATE rollouts SET status = 'cancelled', end_time = ?, queue_seq = NULL WHERE rollout_id = ?",
            (now, rollout.rollout_id),
        )
        return cancelled

    def _see_worker(self, worker_id: str, now: float, stats: JsonDict | None) -> Worker:
        """Insert or refresh a worker; runs inside a write transaction."""
        row = self._conn.execute(
            "INSERT INTO workers (worker_id, first_seen_time, last_heartbeat_time, stats) "
            "VALUES (?, ?, ?, ?) "
            "ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat_time = excluded.last_heartbeat_time, "
            "stats = CASE WHEN ? THEN excluded.stats ELSE workers.stats END "
            f"RETURNING {WORKER_COLUMNS}",
            (worker_id, now, now, json.dumps(stats or {}), stats is not None),
        ).fetchone()
        return worker_from_row(row)

    def _sweep(self) -> None:
        """Apply the watchdog: end live attempts whose deadline has passed.

        The check is skipped when the last one is under ``_SWEEP_INTERVAL_SECONDS`` old by the
        store's clock: deadlines only pass as the clock moves, so a deadline is applied at most that
        late, and exactly on time when the clock has not moved (as with a test's fake clock).
        """
        now = self._clock()
        with self._lock:
            self._check_open()
            if 0 <= now - self._last_sweep < _SWEEP_INTERVAL_SECONDS:
                return
            self._last_sweep = now
            if not self._conn.execute(
                f"SELECT 1 FROM attempts WHERE {_OVERDUE} LIMIT 1", {"now": now}
            ).fetchone():
                return
            changed = False
            with self._write():
                rows = self._conn.execute(
                    f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {_OVERDUE}", {"now": now}
                ).fetchall()
                for row in rows:
                    attempt = attempt_from_row(row)
                    verdict = rules.overdue(attempt, self._rollout(attempt.rollout_id).config, now)
                    if verdict is not None:
                        status, when = verdict
                        ended = rules.move_attempt(attempt, status, when, rules.WATCHDOG_ERRORS[status])
                        changed = self._put_attempt(ended, when) or changed
        if changed:
            self._signal.notify()

    def _seconds_to_deadline(self) -> float | None:
        rows = self._read(
            "SELECT MIN(MIN(COALESCE(timeout_at, 1e308), "
            "COALESCE(last_active_time + silence_seconds, 1e308))) "
            f"FROM attempts WHERE {_LIVE}",
            (),
        )
        deadline = rows[0][0] if rows else None
        return None if deadline is None or deadline >= 1e308 else float(deadline) - self._clock()


class _Checkpointer:
    """Copies the write-ahead log back into the database file, on a thread of its own.

    SQLite's automatic checkpoint runs inside whichever commit crosses its threshold and makes that
    caller wait for the copy and its fsyncs. Here a separate connection runs PASSIVE checkpoints
    (they never block writers or readers) every ``interval_seconds`` instead, so an operation waits
    only for its own commit. Committed data is in the log either way: nothing acknowledged depends
    on a checkpoint having run.
    """

    def __init__(self, path: Path, interval_seconds: float, busy_timeout_seconds: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(path, interval_seconds, busy_timeout_seconds),
            name="fulgor-sqlite-checkpoint",
            daemon=True,
        )
        self._thread.start()

    def _run(self, path: Path, interval_seconds: float, busy_timeout_seconds: float) -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_seconds)
        try:
            while not self._stop.wait(interval_seconds):
                self._checkpoint(conn)
            self._checkpoint(conn)
        finally:
            conn.close()

    @staticmethod
    def _checkpoint(conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as error:  # the next round tries again; the log only grows meanwhile
            logger.warning("checkpoint of the SQLite log failed: %s", error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
