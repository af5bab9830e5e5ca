"""What the dashboard reads: rollouts by filter and page, one rollout whole, resources, workers.

Two readers answer the same questions. :class:`SqliteReader` reads a SQLite store's file over its
own read-only connection (``mode=ro``: it never writes, so it can open the store of a run that has
ended, and of one still training beside the trainer's own connection). Every filter and sort it
offers uses an index (the store keeps each rollout's latest reward and the agents its spans name in
``rollout_rewards`` and ``rollout_agents``), and a page is one indexed query plus a count. A
:class:`StoreReader` reads any other store through the Store protocol (memory, PostgreSQL, a
fulgor server): status, mode and group filters go to the store; the others (reward, agent, step,
resources, attempt status), the sorts by reward or duration, and the count of a mode or group
filter read the newest :data:`SCAN_LIMIT` rollouts that match the first ones, and say so on the page.

What it does not know: pages and HTML (:mod:`fulgor.dashboard.pages`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from fulgor.errors import ConfigError, NotFoundError, ValidationError
from fulgor.limits import quoted
from fulgor.store import _rules as rules
from fulgor.store._rows import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    WORKER_COLUMNS,
    attempt_from_row,
    rollout_from_row,
    worker_from_row,
)
from fulgor.store.base import LATEST, SpanList, Store
from fulgor.types import (
    ROLLOUT_TERMINAL_STATUSES,
    Attempt,
    ResourcesVersion,
    Rollout,
    StoreStats,
    Worker,
)

__all__ = [
    "SCAN_LIMIT",
    "SORTS",
    "Page",
    "Reader",
    "RolloutQuery",
    "RolloutRow",
    "SqliteReader",
    "StoreReader",
    "open_reader",
]

SCAN_LIMIT: Final = 5000
"""How many rollouts a :class:`StoreReader` reads to apply the filters its store cannot."""

Sort = Literal["newest", "oldest", "reward_desc", "reward_asc", "duration_desc"]
SORTS: Final[tuple[Sort, ...]] = ("newest", "oldest", "reward_desc", "reward_asc", "duration_desc")
_LIVE = ("preparing", "running")


@dataclass(frozen=True)
class RolloutQuery:
    """Filters of the rollouts page (each ``None`` or empty matches everything), sort and page."""

    status: tuple[str, ...] = ()
    mode: str | None = None
    group_id: str | None = None
    resources_id: str | None = None
    step: int | None = None
    agent: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    attempt_status: str | None = None
    rollout_ids: tuple[str, ...] | None = None
    """Only these (the rollouts behind a drift count); None: every rollout."""
    sort: Sort = "newest"
    offset: int = 0
    limit: int = 50

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise ValidationError(f"sort must be one of {', '.join(SORTS)}, got {quoted(self.sort)}")
        if not 1 <= self.limit <= 500:
            raise ValidationError(f"limit must be between 1 and 500, got {self.limit}")
        if self.offset < 0:
            raise ValidationError(f"offset must be 0 or more, got {self.offset}")
        if self.reward_min is not None and self.reward_max is not None and self.reward_min > self.reward_max:
            raise ValidationError(f"reward_min ({self.reward_min}) is above reward_max ({self.reward_max})")


@dataclass(frozen=True)
class RolloutRow:
    """One line of the rollouts page: the rollout and its latest reward (None: none yet)."""

    rollout: Rollout
    reward: float | None


@dataclass(frozen=True)
class Page:
    """One page of rollouts, how many match in all, and, for a reader that scans, how far it read."""

    rows: list[RolloutRow]
    total: int
    query: RolloutQuery
    scanned: int | None = None
    """Set when the filters were applied to only the newest ``scanned`` rollouts."""


class Reader(Protocol):
    """The questions the dashboard asks of a store."""

    read_only: bool

    async def rollouts(self, query: RolloutQuery) -> Page: ...

    async def get_rollout(self, rollout_id: str) -> Rollout: ...

    async def list_attempts(self, rollout_id: str) -> list[Attempt]: ...

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> SpanList: ...

    async def resources(self) -> list[ResourcesVersion]: ...

    async def workers(self) -> list[tuple[Worker, list[Attempt]]]: ...

    async def stats(self) -> StoreStats: ...

    async def agents(self) -> list[str]: ...

    async def rollouts_of_step(self, step: int) -> list[Rollout]: ...

    async def close(self) -> None: ...


# -- SQLite -----------------------------------------------------------------------------------------


class SqliteReader:
    """A SQLite store's file, read over a read-only connection; see the module docstring."""

    read_only = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"no store at {self.path}: name a fulgor SQLite store file (store.sqlite)")
        try:
            self._conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=5.0
            )
            tables = {
                row[0] for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        except sqlite3.Error as error:
            raise ConfigError(
                f"cannot read the store file {self.path} ({error}): is it a fulgor store?"
            ) from None
        if "rollouts" not in tables:
            self._conn.close()
            raise ConfigError(f"{self.path} is not a fulgor store (it has no rollouts table)")
        if "rollout_rewards" not in tables:
            self._conn.close()
            raise ConfigError(
                f"the store {self.path} was written by an older fulgor: open it once with this version "
                f"(fulgor store stats --store sqlite:///{self.path}) to index its rewards and agents, "
                "then retry"
            )
        self._lock = threading.Lock()

    def _read_now(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """One query on a thread: a count over a million spans must not stall the event loop that
        also serves the store API and the gateway (``fulgor serve``)."""
        return await asyncio.to_thread(self._read_now, sql, params)

    async def rollouts(self, query: RolloutQuery) -> Page:
        return await asyncio.to_thread(self._rollouts, query)

    def _rollouts(self, query: RolloutQuery) -> Page:
        where, params = _sql_filters(query)
        join = "LEFT JOIN rollout_rewards w ON w.seq = r.seq"
        if (
            query.sort in ("reward_desc", "reward_asc")
            or query.reward_min is not None
            or query.reward_max is not None
        ):
            join = "JOIN rollout_rewards w ON w.seq = r.seq"
        order = {
            "newest": "r.seq DESC",
            "oldest": "r.seq ASC",
            "reward_desc": "w.reward DESC, w.seq DESC",
            "reward_asc": "w.reward ASC, w.seq ASC",
            "duration_desc": "(r.end_time - r.start_time) DESC, r.seq DESC",
        }[query.sort]
        columns = ", ".join(f"r.{name.strip()}" for name in ROLLOUT_COLUMNS.split(","))
        rows = self._read_now(
            f"SELECT {columns}, w.reward FROM rollouts r {join} {where} ORDER BY {order} LIMIT ? OFFSET ?",
            [*params, query.limit, query.offset],
        )
        (total,) = self._read_now(f"SELECT COUNT(*) FROM rollouts r {join} {where}", params)[0]
        return Page([RolloutRow(rollout_from_row(row[:-1]), row[-1]) for row in rows], total, query)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        rows = await self._read(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,))
        if not rows:
            raise NotFoundError(f"rollout {quoted(rollout_id)} not found")
        return rollout_from_row(rows[0])

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        rows = await self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? ORDER BY sequence_id", (rollout_id,)
        )
        return [attempt_from_row(row) for row in rows]

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> SpanList:
        params: list[Any]
        if attempt_id == LATEST:
            rollout = await self.get_rollout(rollout_id)
            sql, params = "AND attempt_seq = ?", [rollout.attempt_count]
        elif attempt_id is not None:
            sql, params = "AND attempt_id = ?", [attempt_id]
        else:
            sql, params = "", []
        rows = await self._read(
            f"SELECT body FROM spans WHERE rollout_id = ? {sql} ORDER BY attempt_seq, sequence_id",
            [rollout_id, *params],
        )
        return rules.read_spans(row[0] for row in rows)

    async def resources(self) -> list[ResourcesVersion]:
        rows = await self._read("SELECT body FROM resources ORDER BY version")
        return [ResourcesVersion.model_validate_json(row[0]) for row in rows]

    async def workers(self) -> list[tuple[Worker, list[Attempt]]]:
        workers = [
            worker_from_row(row)
            for row in await self._read(f"SELECT {WORKER_COLUMNS} FROM workers ORDER BY seq")
        ]
        live = await self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE status IN ('preparing', 'running') "
            "ORDER BY start_time"
        )
        by_worker: dict[str | None, list[Attempt]] = {}
        for row in live:
            attempt = attempt_from_row(row)
            by_worker.setdefault(attempt.worker_id, []).append(attempt)
        return [(worker, by_worker.get(worker.worker_id, [])) for worker in workers]

    async def stats(self) -> StoreStats:
        rollouts = dict(await self._read("SELECT status, COUNT(*) FROM rollouts GROUP BY status"))
        attempts = dict(await self._read("SELECT status, COUNT(*) FROM attempts GROUP BY status"))
        ((spans,),) = await self._read("SELECT COUNT(*) FROM spans")
        ((workers,),) = await self._read("SELECT COUNT(*) FROM workers")
        ((versions,),) = await self._read("SELECT COUNT(*) FROM resources")
        return StoreStats(
            rollouts=rollouts, attempts=attempts, spans=spans, workers=workers, resources_versions=versions
        )

    async def agents(self) -> list[str]:
        # One index seek per distinct name (a loose index scan), not a pass over every row.
        names: list[str] = []
        row = await self._read("SELECT MIN(agent_name) FROM rollout_agents")
        while row and row[0][0] is not None and len(names) < 200:
            names.append(row[0][0])
            row = await self._read(
                "SELECT MIN(agent_name) FROM rollout_agents WHERE agent_name > ?", (names[-1],)
            )
        return names

    async def rollouts_of_step(self, step: int) -> list[Rollout]:
        rows = await self._read(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE json_extract(metadata, '$.step') = ? ORDER BY seq",
            (step,),
        )
        return [rollout_from_row(row) for row in rows]

    async def close(self) -> None:
        with self._lock:
            self._conn.close()


def _sql_filters(query: RolloutQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if query.status:
        clauses.append(f"r.status IN ({','.join('?' * len(query.status))})")
        params += query.status
    for column, value in (
        ("mode", query.mode),
        ("group_id", query.group_id),
        ("resources_id", query.resources_id),
    ):
        if value is not None:
            clauses.append(f"r.{column} = ?")
            params.append(value)
    if query.step is not None:
        clauses.append("json_extract(r.metadata, '$.step') = ?")
        params.append(query.step)
    if query.agent is not None:
        clauses.append("r.seq IN (SELECT seq FROM rollout_agents WHERE agent_name = ?)")
        params.append(query.agent)
    if query.reward_min is not None:
        clauses.append("w.reward >= ?")
        params.append(query.reward_min)
    if query.reward_max is not None:
        clauses.append("w.reward <= ?")
        params.append(query.reward_max)
    if query.attempt_status is not None:
        clauses.append("r.rollout_id IN (SELECT rollout_id FROM attempts WHERE status = ?)")
        params.append(query.attempt_status)
    if query.rollout_ids is not None:
        clauses.append("r.rollout_id IN (SELECT value FROM json_each(?))")
        params.append(json.dumps(list(query.rollout_ids)))
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


# -- any store --------------------------------------------------------------------------------------


class StoreReader:
    """Any store, through the Store protocol; see the module docstring for what it scans."""

    read_only = False

    def __init__(self, store: Store) -> None:
        self.store = store

    async def rollouts(self, query: RolloutQuery) -> Page:
        order: Literal["asc", "desc"] = "asc" if query.sort == "oldest" else "desc"
        common: dict[str, Any] = {
            "status": list(query.status) or None,
            "group_id": query.group_id,
            "mode": query.mode,
        }
        scanned_filters = (
            query.resources_id,
            query.step,
            query.agent,
            query.reward_min,
            query.reward_max,
            query.attempt_status,
            query.rollout_ids,
        )
        if all(value is None for value in scanned_filters) and query.sort in ("newest", "oldest"):
            rollouts = await self.store.query_rollouts(
                **common, limit=query.limit, offset=query.offset, order=order
            )
            rows = [RolloutRow(r, await self._reward(r)) for r in rollouts]
            if query.mode is None and query.group_id is None:  # the store counts per status itself
                counts = (await self.store.stats()).rollouts
                total = sum(n for status, n in counts.items() if not query.status or status in query.status)
                return Page(rows, total, query)
            # Counted up to SCAN_LIMIT, so that a page never reads a whole large store.
            matching = len(await self.store.query_rollouts(**common, limit=SCAN_LIMIT))
            scanned = SCAN_LIMIT if matching == SCAN_LIMIT else None
            return Page(rows, matching, query, scanned)
        candidates = await self.store.query_rollouts(**common, limit=SCAN_LIMIT, order=order)
        rows = []
        for rollout in candidates:
            row = RolloutRow(rollout, await self._reward(rollout))
            if await self._matches(row, query):
                rows.append(row)
        rows = _sorted(rows, query.sort)
        scanned = len(candidates) if len(candidates) == SCAN_LIMIT else None
        return Page(rows[query.offset : query.offset + query.limit], len(rows), query, scanned)

    async def _reward(self, rollout: Rollout) -> float | None:
        if rollout.attempt_count == 0:
            return None
        facts = [rules.span_facts(s)[0] for s in await self.store.query_spans(rollout.rollout_id)]
        rewards = [reward for reward in facts if reward is not None]
        return rewards[-1] if rewards else None

    async def _matches(self, row: RolloutRow, query: RolloutQuery) -> bool:
        rollout = row.rollout
        if query.resources_id is not None and rollout.resources_id != query.resources_id:
            return False
        if query.step is not None and rollout.metadata.get("step") != query.step:
            return False
        if query.rollout_ids is not None and rollout.rollout_id not in query.rollout_ids:
            return False
        if query.reward_min is not None and (row.reward is None or row.reward < query.reward_min):
            return False
        if query.reward_max is not None and (row.reward is None or row.reward > query.reward_max):
            return False
        if query.attempt_status is not None:
            attempts = await self.store.list_attempts(rollout.rollout_id)
            if all(attempt.status != query.attempt_status for attempt in attempts):
                return False
        if query.agent is not None:
            spans = await self.store.query_spans(rollout.rollout_id) if rollout.attempt_count else []
            if all(rules.span_facts(span)[1] != query.agent for span in spans):
                return False
        return True

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return await self.store.get_rollout(rollout_id)

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        return await self.store.list_attempts(rollout_id)

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> SpanList:
        return await self.store.query_spans(rollout_id, attempt_id)

    async def resources(self) -> list[ResourcesVersion]:
        """The versions the store can name: the latest and those its newest rollouts ran with."""
        found: dict[str, ResourcesVersion] = {}
        latest = await self.store.get_resources()
        if latest is not None:
            found[latest.resources_id] = latest
        for rollout in await self.store.query_rollouts(limit=SCAN_LIMIT, order="desc"):
            if rollout.resources_id is not None and rollout.resources_id not in found:
                try:
                    version = await self.store.get_resources(rollout.resources_id)
                except NotFoundError:
                    continue
                if version is not None:
                    found[version.resources_id] = version
        return sorted(found.values(), key=lambda version: version.version)

    async def workers(self) -> list[tuple[Worker, list[Attempt]]]:
        live = await self.store.query_rollouts(status=["preparing", "running"])
        by_worker: dict[str | None, list[Attempt]] = {}
        for rollout in live:
            attempts = await self.store.list_attempts(rollout.rollout_id)
            if attempts and attempts[-1].status in _LIVE:
                by_worker.setdefault(attempts[-1].worker_id, []).append(attempts[-1])
        return [(worker, by_worker.get(worker.worker_id, [])) for worker in await self.store.list_workers()]

    async def stats(self) -> StoreStats:
        return await self.store.stats()

    async def agents(self) -> list[str]:
        names: set[str] = set()
        for rollout in await self.store.query_rollouts(limit=200, order="desc"):
            if rollout.attempt_count:
                for span in await self.store.query_spans(rollout.rollout_id):
                    agent = rules.span_facts(span)[1]
                    if agent is not None:
                        names.add(agent)
        return sorted(names)

    async def rollouts_of_step(self, step: int) -> list[Rollout]:
        rollouts = await self.store.query_rollouts(limit=SCAN_LIMIT, order="desc")
        return [r for r in reversed(rollouts) if r.metadata.get("step") == step]

    async def close(self) -> None:
        return None


def _sorted(rows: list[RolloutRow], sort: Sort) -> list[RolloutRow]:
    if sort in ("reward_desc", "reward_asc"):
        rewarded = [row for row in rows if row.reward is not None]
        return sorted(rewarded, key=lambda row: row.reward or 0.0, reverse=sort == "reward_desc")
    if sort == "duration_desc":

        def duration(row: RolloutRow) -> float:
            r = row.rollout
            return (
                (r.end_time - r.start_time) if r.end_time is not None and r.start_time is not None else -1.0
            )

        return sorted(rows, key=duration, reverse=True)
    return rows


def is_live(rollout: Rollout) -> bool:
    """Whether the rollout may still change (not succeeded, failed or cancelled)."""
    return rollout.status not in ROLLOUT_TERMINAL_STATUSES


def open_reader(store: Store) -> Reader:
    """The fastest reader of ``store``: its own file's for a SQLite store, the protocol's otherwise."""
    from fulgor.store.sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        return SqliteReader(store.path)
    return StoreReader(store)
