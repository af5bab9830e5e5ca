"""PostgresStore: the store for many processes on many machines, all sharing one PostgreSQL database.

Servers stay stateless: any number of ``fulgor serve`` processes may open the same database and
schema. Every operation runs in one transaction, so a call that raises writes nothing. Claims lock
queued rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` in queue order, so each rollout goes to
exactly one worker however many claimers race. Every writer locks rollouts before attempts and
each kind in id order, so writers do not deadlock; a transaction PostgreSQL aborts anyway is retried.

Waiting is driven by events: every write that can end a wait sends ``NOTIFY`` on the store's
channel inside its transaction (delivered when it commits), and each store ``LISTEN``s on one
dedicated connection and wakes its waiting ``claim``/``wait`` calls, whichever process made the
change. Watchdog deadlines wake waiters too (see :mod:`fulgor.store.base`).

Times come from the store's ``clock`` in Python, never from ``now()`` in SQL: deadlines written by
one machine are read by another, so keep the machines' clocks synchronised (NTP).

What it does not know: HTTP, agents, training. A PostgresStore belongs to the event loop that
opens it; it connects on :meth:`PostgresStore.open` or on its first operation. psycopg is the
``fulgor[postgres]`` extra, imported only when a store opens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from fulgor.errors import NotFoundError
from fulgor.limits import quoted
from fulgor.store import _rules as rules
from fulgor.store._postgres_db import Database, fetch
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

if TYPE_CHECKING:
    from fulgor.store._postgres_db import Connection

__all__ = ["PostgresStore"]

T = TypeVar("T")

_LIVE = "status IN ('preparing', 'running')"
# Live attempts past their timeout or silence deadline; the partial index attempts_live keeps it cheap.
_OVERDUE = f"{_LIVE} AND (timeout_at <= %(now)s OR last_active_time + silence_seconds <= %(now)s)"
# Every queued rollout may be locked by claims in flight; they end within milliseconds.
_LOCKED_RETRY_SECONDS = 0.005


class PostgresStore(ValidatedStore):
    """Store in one PostgreSQL schema; see :class:`fulgor.store.base.Store` for the contract.

    ``conninfo`` is a libpq URL (``postgresql://USER:PASSWORD@HOST:PORT/DB``) or key=value string.
    The tables live in ``schema`` (created when missing unless ``create`` is False); stores on
    different schemas of one database are independent.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "fulgor",
        create: bool = True,
        max_connections: int = 10,
        connect_timeout_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._signal = rules.ChangeSignal()
        self._db = Database(
            conninfo,
            schema=schema,
            create=create,
            max_connections=max_connections,
            connect_timeout_seconds=connect_timeout_seconds,
            on_notify=self._signal.notify,
        )

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> PostgresStore:
        """A store from ``postgresql://USER:PASSWORD@HOST:PORT/DB[?schema=NAME&...]``.

        ``schema`` (default ``fulgor``) is fulgor's own parameter; the others go to libpq.
        """
        parts = urlsplit(url)
        schema, kept = "fulgor", []
        for item in parts.query.split("&") if parts.query else []:
            key, _, value = item.partition("=")
            if key == "schema":
                schema = unquote(value)
            else:
                kept.append(item)  # as written: libpq decodes its own parameters
        conninfo = urlunsplit(parts._replace(query="&".join(kept)))
        return cls(conninfo, schema=schema, create=create)

    @property
    def schema(self) -> str:
        return self._db.schema

    async def open(self) -> None:
        """Connect, create the schema if needed and start listening; a second call does nothing."""
        await self._db.open()

    # -- rollouts ---------------------------------------------------------------------------------

    async def _enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        now = self._clock()
        created = [rules.rollout_from_request(request, now) for request in requests]

        async def insert(conn: Connection) -> None:
            async with conn.cursor() as cursor:
                await cursor.executemany(
                    f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}, queue_seq) "
                    f"VALUES ({_marks(12)}, nextval('queue_positions'))",
                    [rollout_row(rollout) for rollout in created],
                )
            await self._db.notify(conn)

        async with self._db.connection() as conn:
            await self._sweep(conn)
            if created:
                await self._db.transaction(conn, insert)
        if created:
            self._signal.notify()
        return created

    async def _start_rollout(self, request: RolloutRequest, worker_id: str) -> AttemptedRollout:
        rollout = rules.rollout_from_request(request, self._clock())

        async def insert(conn: Connection) -> AttemptedRollout:
            await conn.execute(
                f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES ({_marks(12)})", rollout_row(rollout)
            )
            return await self._begin(conn, rollout, worker_id)

        async with self._db.connection() as conn:
            await self._sweep(conn)
            return await self._db.transaction(conn, insert)

    async def _claim(self, worker_id: str, limit: int, wait_seconds: float) -> list[AttemptedRollout]:
        async def claim_once(conn: Connection) -> list[AttemptedRollout] | None:
            return await self._claim_now(conn, worker_id, limit) or None

        claimed = await self._wait_for(claim_once, wait_seconds)
        return claimed or []

    async def _get_rollout(self, rollout_id: str) -> Rollout:
        async with self._db.connection() as conn:
            await self._sweep(conn)
            return await self._rollout(conn, rollout_id)

    async def _query_rollouts(
        self,
        statuses: frozenset[str] | None,
        group_id: str | None,
        mode: RolloutMode | None,
        limit: int | None,
        offset: int,
        order: Literal["asc", "desc"],
    ) -> list[Rollout]:
        clauses = ["TRUE"]
        params: list[Any] = []
        if statuses is not None:
            clauses.append("status = ANY(%s)")
            params.append(sorted(statuses))
        if group_id is not None:
            clauses.append("group_id = %s")
            params.append(group_id)
        if mode is not None:
            clauses.append("mode = %s")
            params.append(mode)
        direction = "DESC" if order == "desc" else "ASC"
        params.extend([limit, offset])
        async with self._db.connection() as conn:
            await self._sweep(conn)
            rows = await fetch(
                conn,
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE {' AND '.join(clauses)} "
                f"ORDER BY seq {direction} LIMIT %s OFFSET %s",
                params,
            )
        return [rollout_from_row(row) for row in rows]

    async def _cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        now = self._clock()

        async def cancel_all(conn: Connection) -> list[Rollout]:
            found = await self._locked_rollouts(conn, rollout_ids)
            rules.check_cancellable(list(found.values()))
            for rollout_id, rollout in sorted(found.items()):
                if rollout.status != "cancelled":
                    found[rollout_id] = await self._cancel_one(conn, rollout, now)
            await self._db.notify(conn)
            return [found[rollout_id] for rollout_id in rollout_ids]

        async with self._db.connection() as conn:
            await self._sweep(conn)
            result = await self._db.transaction(conn, cancel_all)
        self._signal.notify()
        return result

    async def _start_attempt(self, rollout_id: str, worker_id: str) -> AttemptedRollout:

        async def start(conn: Connection) -> AttemptedRollout:
            return await self._begin(conn, await self._rollout(conn, rollout_id, lock=True), worker_id)

        async with self._db.connection() as conn:
            await self._sweep(conn)
            return await self._db.transaction(conn, start)

    # -- attempts ---------------------------------------------------------------------------------

    async def _update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | None,
        error: str | None,
        metadata: JsonDict | None,
    ) -> Attempt:
        now = self._clock()

        async def update(conn: Connection) -> tuple[Attempt, bool]:
            await self._rollout(conn, rollout_id, lock=True)
            attempt = await self._attempt(conn, rollout_id, attempt_id, lock=True)
            updated = rules.updated_attempt(attempt, now, status=status, error=error, metadata=metadata)
            return updated, await self._put_attempt(conn, updated, now)

        async with self._db.connection() as conn:
            await self._sweep(conn)
            updated, changed = await self._db.transaction(conn, update)
        if changed:
            self._signal.notify()
        return updated

    async def _list_attempts(self, rollout_id: str) -> list[Attempt]:
        async with self._db.connection() as conn:
            await self._sweep(conn)
            await self._rollout(conn, rollout_id)
            rows = await fetch(
                conn,
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = %s ORDER BY sequence_id",
                (rollout_id,),
            )
        return [attempt_from_row(row) for row in rows]

    # -- spans ------------------------------------------------------------------------------------

    async def _add_spans(self, spans: Sequence[Span]) -> list[Span]:
        now = self._clock()
        keys = list(dict.fromkeys((span.rollout_id, span.attempt_id) for span in spans))

        async def add(conn: Connection) -> tuple[list[Span], bool]:
            for key in keys:  # NotFoundError names the first unknown id in input order
                await self._attempt(conn, *key)
            for rollout_id in sorted({rollout_id for rollout_id, _ in keys}):
                await self._rollout(conn, rollout_id, lock=True)
            attempts = {key: await self._attempt(conn, *key, lock=True) for key in sorted(keys)}
            stored = await self._store_spans(conn, spans, attempts)
            changed = False
            for attempt in attempts.values():
                if attempt.is_live:
                    running = attempt.model_copy(update={"status": "running", "last_active_time": now})
                    changed = await self._put_attempt(conn, running, now) or changed
            return stored, changed

        async with self._db.connection() as conn:
            await self._sweep(conn)
            stored, changed = await self._db.transaction(conn, add)
        if changed:
            self._signal.notify()
        return stored

    async def _query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None,
        name: str | None,
        limit: int | None,
        offset: int,
    ) -> SpanList:
        async with self._db.connection() as conn:
            await self._sweep(conn)
            rollout = await self._rollout(conn, rollout_id)
            clauses = ["rollout_id = %s"]
            params: list[Any] = [rollout_id]
            if attempt_id == LATEST:
                clauses.append("attempt_seq = %s")
                params.append(rollout.attempt_count)
            elif attempt_id is not None:
                clauses.append("attempt_seq = %s")
                params.append((await self._attempt(conn, rollout_id, attempt_id)).sequence_id)
            if name is not None:
                clauses.append("name = %s")
                params.append(name)
            params.extend([limit, offset])
            rows = await fetch(
                conn,
                f"SELECT body FROM spans WHERE {' AND '.join(clauses)} "
                "ORDER BY attempt_seq, sequence_id LIMIT %s OFFSET %s",
                params,
            )
        return rules.read_spans(row[0] for row in rows)

    # -- resources --------------------------------------------------------------------------------

    async def _put_resources(self, resources: Resources, resources_id: str | None) -> ResourcesVersion:

        async def put(conn: Connection) -> ResourcesVersion:
            # Versions are MAX + 1: one writer at a time, readers unaffected.
            await conn.execute("LOCK TABLE resources IN SHARE ROW EXCLUSIVE MODE")
            [(version,)] = await fetch(conn, "SELECT COALESCE(MAX(version), 0) + 1 FROM resources")
            stored = rules.resources_version(resources, resources_id, version, self._clock())
            await conn.execute(
                "INSERT INTO resources (resources_id, version, body) VALUES (%s, %s, %s) "
                "ON CONFLICT (resources_id) DO UPDATE SET version = excluded.version, body = excluded.body",
                (stored.resources_id, version, stored.model_dump_json()),
            )
            return stored

        async with self._db.connection() as conn:
            return await self._db.transaction(conn, put)

    async def _get_resources(self, resources_id: str | None) -> ResourcesVersion | None:
        async with self._db.connection() as conn:
            if resources_id is None:
                rows = await fetch(conn, "SELECT body FROM resources ORDER BY version DESC LIMIT 1")
                return ResourcesVersion.model_validate_json(rows[0][0]) if rows else None
            rows = await fetch(conn, "SELECT body FROM resources WHERE resources_id = %s", (resources_id,))
        if not rows:
            raise NotFoundError(f"resources {quoted(resources_id)} not found")
        return ResourcesVersion.model_validate_json(rows[0][0])

    # -- workers, waiting, stats ------------------------------------------------------------------

    async def _heartbeat(
        self, worker_id: str, stats: JsonDict | None, attempt_ids: Sequence[str] | None
    ) -> Worker:
        now = self._clock()
        mine = f"worker_id = %(worker)s AND {_LIVE}"
        if attempt_ids is not None:
            mine += " AND attempt_id = ANY(%(ids)s)"
        params = {"worker": worker_id, "ids": list(attempt_ids or ()), "now": now}

        async def beat(conn: Connection) -> Worker:
            # Lock in rollout order, the order every other writer takes attempts in.
            await conn.execute(f"SELECT 1 FROM attempts WHERE {mine} ORDER BY rollout_id FOR UPDATE", params)
            await conn.execute(f"UPDATE attempts SET last_active_time = %(now)s WHERE {mine}", params)
            return await self._see_worker(conn, worker_id, now, stats)

        async with self._db.connection() as conn:
            await self._sweep(conn)
            return await self._db.transaction(conn, beat)

    async def _list_workers(self) -> list[Worker]:
        async with self._db.connection() as conn:
            rows = await fetch(conn, f"SELECT {WORKER_COLUMNS} FROM workers ORDER BY seq")
        return [worker_from_row(row) for row in rows]

    async def _wait(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        async with self._db.connection() as conn:
            for rollout_id in rollout_ids:
                await self._rollout(conn, rollout_id)

        async def all_done(conn: Connection) -> list[Rollout] | None:
            done = await self._terminal(conn, rollout_ids)
            return done if len(done) == len(rollout_ids) else None

        done = await self._wait_for(all_done, timeout_seconds)
        if done is not None:
            return done
        async with self._db.connection() as conn:
            return await self._terminal(conn, rollout_ids)

    async def _stats(self) -> StoreStats:
        async with self._db.connection() as conn:
            await self._sweep(conn)
            # One statement reads one snapshot, so the counts agree with each other.
            [(rollouts, attempts, spans, workers, versions)] = await fetch(
                conn,
                "SELECT "
                "(SELECT json_object_agg(status, n) FROM "
                "(SELECT status, COUNT(*) AS n FROM rollouts GROUP BY status) AS r), "
                "(SELECT json_object_agg(status, n) FROM "
                "(SELECT status, COUNT(*) AS n FROM attempts GROUP BY status) AS a), "
                "(SELECT COUNT(*) FROM spans), (SELECT COUNT(*) FROM workers), "
                "(SELECT COUNT(*) FROM resources)",
            )
        return StoreStats(
            rollouts=rollouts or {},
            attempts=attempts or {},
            spans=spans,
            workers=workers,
            resources_versions=versions,
        )

    async def close(self) -> None:
        await self._db.close()
        self._signal.notify()

    # -- waiting ----------------------------------------------------------------------------------

    async def _wait_for(
        self, check: Callable[[Connection], Awaitable[T | None]], timeout_seconds: float
    ) -> T | None:
        """Run ``check`` until it returns a result, sleeping between tries until a change or a deadline."""
        deadline = _Deadline(self._clock)

        async def check_once() -> T | None:
            async with self._db.connection() as conn:
                result = await check(conn)
                if result is None:
                    deadline.at = await self._next_deadline(conn)
                return result

        return await rules.wait_for_result(check_once, self._signal, timeout_seconds, deadline.seconds_left)

    # -- rows -------------------------------------------------------------------------------------

    async def _rollout(self, conn: Connection, rollout_id: str, *, lock: bool = False) -> Rollout:
        suffix = " FOR UPDATE" if lock else ""
        rows = await fetch(
            conn, f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = %s{suffix}", (rollout_id,)
        )
        if not rows:
            raise NotFoundError(f"rollout {quoted(rollout_id)} not found")
        return rollout_from_row(rows[0])

    async def _locked_rollouts(self, conn: Connection, rollout_ids: Sequence[str]) -> dict[str, Rollout]:
        """The rollouts, locked in id order (so concurrent calls never deadlock), keyed in input order."""
        rows = await fetch(
            conn,
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ANY(%s) "
            "ORDER BY rollout_id FOR UPDATE",
            (list(rollout_ids),),
        )
        by_id = {rollout.rollout_id: rollout for rollout in map(rollout_from_row, rows)}
        for rollout_id in rollout_ids:
            if rollout_id not in by_id:
                raise NotFoundError(f"rollout {quoted(rollout_id)} not found")
        return {rollout_id: by_id[rollout_id] for rollout_id in rollout_ids}

    async def _attempt(
        self, conn: Connection, rollout_id: str, attempt_id: str, *, lock: bool = False
    ) -> Attempt:
        suffix = " FOR UPDATE" if lock else ""
        rows = await fetch(
            conn,
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = %s AND rollout_id = %s{suffix}",
            (attempt_id, rollout_id),
        )
        if not rows:
            await self._rollout(conn, rollout_id)
            raise NotFoundError(f"attempt {quoted(attempt_id)} of rollout {quoted(rollout_id)} not found")
        return attempt_from_row(rows[0])

    async def _terminal(self, conn: Connection, rollout_ids: Sequence[str]) -> list[Rollout]:
        """The listed rollouts that are terminal, in input order."""
        await self._sweep(conn)
        rows = await fetch(
            conn, f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ANY(%s)", (list(rollout_ids),)
        )
        by_id = {rollout.rollout_id: rollout for rollout in map(rollout_from_row, rows)}
        rollouts = [by_id[rollout_id] for rollout_id in rollout_ids]
        return [rollout for rollout in rollouts if rollout.status in ROLLOUT_TERMINAL_STATUSES]

    async def _claim_now(self, conn: Connection, worker_id: str, limit: int) -> list[AttemptedRollout]:
        async def take(conn: Connection) -> list[AttemptedRollout]:
            rows = await fetch(
                conn,
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE queue_seq IS NOT NULL "
                "ORDER BY queue_seq LIMIT %s FOR UPDATE SKIP LOCKED",
                (limit,),
            )
            claimed = [await self._begin(conn, rollout_from_row(row), worker_id) for row in rows]
            if claimed:
                await self._see_worker(conn, worker_id, self._clock(), None)
            return claimed

        await self._sweep(conn)
        while await fetch(conn, "SELECT 1 FROM rollouts WHERE queue_seq IS NOT NULL LIMIT 1"):
            claimed = await self._db.transaction(conn, take)
            if claimed:
                return claimed
            await asyncio.sleep(_LOCKED_RETRY_SECONDS)
        return []

    async def _begin(self, conn: Connection, rollout: Rollout, worker_id: str) -> AttemptedRollout:
        """Start an attempt; runs inside a write transaction holding the rollout's row lock."""
        latest = await fetch(conn, "SELECT resources_id FROM resources ORDER BY version DESC LIMIT 1")
        now = self._clock()
        rollout, attempt = rules.begin_attempt(rollout, worker_id, now, latest[0][0] if latest else None)
        config = rollout.config
        timeout_at = None if config.timeout_seconds is None else attempt.start_time + config.timeout_seconds
        await conn.execute(
            "UPDATE rollouts SET status = %s, attempt_count = %s, start_time = %s, resources_id = %s, "
            "queue_seq = NULL WHERE rollout_id = %s",
            (
                rollout.status,
                rollout.attempt_count,
                rollout.start_time,
                rollout.resources_id,
                rollout.rollout_id,
            ),
        )
        await conn.execute(
            f"INSERT INTO attempts ({ATTEMPT_COLUMNS}, timeout_at, silence_seconds) VALUES ({_marks(12)})",
            (*attempt_row(attempt), timeout_at, config.unresponsive_seconds),
        )
        if config.timeout_seconds is not None or config.unresponsive_seconds is not None:
            await self._db.notify(conn)  # waiters elsewhere learn of the new watchdog deadline
        return rules.attempted(rollout, attempt)

    async def _put_attempt(self, conn: Connection, attempt: Attempt, now: float) -> bool:
        """Store a changed attempt and move its rollout along; True when a rollout status changed.

        The caller holds the rollout's row lock.
        """
        rollout = await self._rollout(conn, attempt.rollout_id)
        await conn.execute(
            "UPDATE attempts SET status = %s, end_time = %s, last_active_time = %s, error = %s, "
            "metadata = %s WHERE attempt_id = %s",
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
        requeue = updated.status in ROLLOUT_QUEUED_STATUSES
        await conn.execute(
            "UPDATE rollouts SET status = %s, end_time = %s, "
            "queue_seq = CASE WHEN %s THEN nextval('queue_positions') END WHERE rollout_id = %s",
            (updated.status, updated.end_time, requeue, updated.rollout_id),
        )
        if requeue or updated.status in ROLLOUT_TERMINAL_STATUSES:
            await self._db.notify(conn)  # what claims and waits sleep on; "running" wakes nobody
        return True

    async def _store_spans(
        self, conn: Connection, spans: Sequence[Span], attempts: dict[tuple[str, str], Attempt]
    ) -> list[Span]:
        """Insert the spans the attempts do not hold yet, allocating sequence ids; runs in a transaction."""
        rows = await fetch(
            conn,
            "SELECT attempt_id, span_id, body, sequence_id FROM spans "
            "WHERE (attempt_id, span_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([span.attempt_id for span in spans], [span.span_id for span in spans]),
        )
        added = {(span.attempt_id, span.span_id): span for span in spans}
        known = {(row[0], row[1]): rules.stored_span(row[2], row[3], added[row[0], row[1]]) for row in rows}
        counts = await self._span_counts(conn, [attempt_id for _, attempt_id in attempts])
        stored, new_rows = [], []
        for span in spans:
            existing = known.get((span.attempt_id, span.span_id))
            if existing is None:
                counts[span.attempt_id] += 1
                existing = span.model_copy(update={"sequence_id": counts[span.attempt_id]})
                known[(span.attempt_id, span.span_id)] = existing
                attempt_seq = attempts[(span.rollout_id, span.attempt_id)].sequence_id
                new_rows.append(_span_row(existing, attempt_seq))
            stored.append(existing)
        if new_rows:
            async with conn.cursor() as cursor:
                await cursor.executemany(
                    "INSERT INTO spans (rollout_id, attempt_seq, attempt_id, sequence_id, span_id, name, "
                    f"body) VALUES ({_marks(7)})",
                    new_rows,
                )
            await conn.execute(
                "UPDATE attempts SET span_count = c.n FROM unnest(%s::text[], %s::int[]) AS c(id, n) "
                "WHERE attempts.attempt_id = c.id",
                (list(counts), list(counts.values())),
            )
        return stored

    async def _span_counts(self, conn: Connection, attempt_ids: list[str]) -> dict[str, int]:
        rows = await fetch(
            conn, "SELECT attempt_id, span_count FROM attempts WHERE attempt_id = ANY(%s)", (attempt_ids,)
        )
        return {row[0]: int(row[1]) for row in rows}

    async def _cancel_one(self, conn: Connection, rollout: Rollout, now: float) -> Rollout:
        rows = await fetch(
            conn,
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = %s AND {_LIVE} FOR UPDATE",
            (rollout.rollout_id,),
        )
        for row in rows:
            ended = rules.move_attempt(attempt_from_row(row), "failed", now, "cancelled")
            await conn.execute(
                "UPDATE attempts SET status = %s, end_time = %s, error = %s WHERE attempt_id = %s",
                (ended.status, ended.end_time, ended.error, ended.attempt_id),
            )
        await conn.execute(
            "UPDATE rollouts SET status = 'cancelled', end_time = %s, queue_seq = NULL WHERE rollout_id = %s",
            (now, rollout.rollout_id),
        )
        return rollout.model_copy(update={"status": "cancelled", "end_time": now})

    async def _see_worker(
        self, conn: Connection, worker_id: str, now: float, stats: JsonDict | None
    ) -> Worker:
        """Insert or refresh a worker; runs inside a write transaction."""
        rows = await fetch(
            conn,
            "INSERT INTO workers (worker_id, first_seen_time, last_heartbeat_time, stats) "
            "VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat_time = excluded.last_heartbeat_time, "
            "stats = CASE WHEN %s THEN excluded.stats ELSE workers.stats END "
            f"RETURNING {WORKER_COLUMNS}",
            (worker_id, now, now, json.dumps(stats or {}), stats is not None),
        )
        return worker_from_row(rows[0])

    # -- watchdog ---------------------------------------------------------------------------------

    async def _sweep(self, conn: Connection) -> None:
        """Apply the watchdog: end live attempts whose deadline has passed."""
        now = self._clock()
        rows = await fetch(conn, f"SELECT DISTINCT rollout_id FROM attempts WHERE {_OVERDUE}", {"now": now})
        if not rows:
            return

        async def end_overdue(conn: Connection) -> bool:
            changed = False
            rollouts = await self._locked_rollouts(conn, sorted(row[0] for row in rows))
            for rollout_id, rollout in rollouts.items():
                # Re-read under the lock: another process may have ended or refreshed the attempt.
                live = await fetch(
                    conn,
                    f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = %(id)s AND {_OVERDUE} "
                    "FOR UPDATE",
                    {"id": rollout_id, "now": now},
                )
                for row in live:
                    attempt = attempt_from_row(row)
                    verdict = rules.overdue(attempt, rollout.config, now)
                    if verdict is not None:
                        status, when = verdict
                        ended = rules.move_attempt(attempt, status, when, rules.WATCHDOG_ERRORS[status])
                        changed = await self._put_attempt(conn, ended, when) or changed
            return changed

        if await self._db.transaction(conn, end_overdue):
            self._signal.notify()

    async def _next_deadline(self, conn: Connection) -> float | None:
        rows = await fetch(
            conn,
            f"SELECT MIN(LEAST(timeout_at, last_active_time + silence_seconds)) FROM attempts WHERE {_LIVE}",
        )
        deadline = rows[0][0]
        return None if deadline is None else float(deadline)


class _Deadline:
    """The next watchdog deadline one waiting call has seen, refreshed after each of its checks."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.at: float | None = None
        self._clock = clock

    def seconds_left(self) -> float | None:
        return None if self.at is None else self.at - self._clock()


def _marks(count: int) -> str:
    return ", ".join(["%s"] * count)


def _span_row(span: Span, attempt_seq: int) -> tuple[Any, ...]:
    return (
        span.rollout_id,
        attempt_seq,
        span.attempt_id,
        span.sequence_id,
        span.span_id,
        span.name,
        span.model_dump_json(),
    )
