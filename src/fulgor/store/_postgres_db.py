"""The PostgreSQL plumbing under PostgresStore: connections, the schema, transactions, LISTEN/NOTIFY.

It knows tables and connections, not rollouts: :mod:`fulgor.store.postgres` owns what the rows
mean. psycopg and psycopg_pool (the ``fulgor[postgres]`` extra) are imported when a database opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from fulgor.errors import ConfigError, StoreUnavailableError, ValidationError

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    Connection: TypeAlias = AsyncConnection[tuple[Any, ...]]

__all__ = ["Database", "fetch"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_DDL = """
CREATE SEQUENCE IF NOT EXISTS queue_positions;
CREATE TABLE IF NOT EXISTS rollouts (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_id TEXT NOT NULL UNIQUE,
    queue_seq BIGINT,
    status TEXT NOT NULL,
    mode TEXT NOT NULL,
    group_id TEXT,
    resources_id TEXT,
    input TEXT NOT NULL,
    config TEXT NOT NULL,
    metadata TEXT NOT NULL,
    enqueue_time DOUBLE PRECISION NOT NULL,
    start_time DOUBLE PRECISION,
    end_time DOUBLE PRECISION,
    attempt_count INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rollouts_queue ON rollouts (queue_seq) WHERE queue_seq IS NOT NULL;
CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts (status);
CREATE INDEX IF NOT EXISTS rollouts_group ON rollouts (group_id) WHERE group_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    sequence_id INTEGER NOT NULL,
    worker_id TEXT,
    status TEXT NOT NULL,
    start_time DOUBLE PRECISION NOT NULL,
    end_time DOUBLE PRECISION,
    last_active_time DOUBLE PRECISION NOT NULL,
    error TEXT,
    metadata TEXT NOT NULL,
    timeout_at DOUBLE PRECISION,
    silence_seconds DOUBLE PRECISION,
    span_count INTEGER NOT NULL DEFAULT 0,
    UNIQUE (rollout_id, sequence_id)
);
CREATE INDEX IF NOT EXISTS attempts_live ON attempts (worker_id) WHERE status IN ('preparing', 'running');
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
);
CREATE TABLE IF NOT EXISTS resources (
    resources_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL UNIQUE,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS workers (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker_id TEXT NOT NULL UNIQUE,
    first_seen_time DOUBLE PRECISION NOT NULL,
    last_heartbeat_time DOUBLE PRECISION NOT NULL,
    stats TEXT NOT NULL
)
"""

# Every object SCHEMA_DDL creates: when all exist, opening skips the DDL, whose CREATE INDEX takes a
# SHARE lock on its table even when the index exists (and so could deadlock with running writers).
_SCHEMA_OBJECTS = tuple(re.findall(r"IF NOT EXISTS (\w+)", SCHEMA_DDL))
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,49}")
# Any constant works: it only has to be the same in every process creating a schema.
_SCHEMA_LOCK_KEY = 0x66756C676F72
_TRANSACTION_TRIES = 5
_RECONNECT_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0)


class Database:
    """One schema of one PostgreSQL database: a connection pool plus one connection that LISTENs.

    ``on_notify`` runs for every notification on the schema's channel, from any process.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str,
        create: bool,
        max_connections: int,
        connect_timeout_seconds: float,
        on_notify: Callable[[], None],
    ) -> None:
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise ValidationError(
                "schema must be 1-50 lowercase letters, digits or underscores, not starting with a digit; "
                f"got {schema!r}"
            )
        if max_connections < 1:
            raise ValidationError(f"max_connections must be >= 1, got {max_connections!r}")
        self.schema = schema
        self.channel = f"fulgor_{schema}"
        self._conninfo = conninfo
        self._create = create
        self._max_connections = max_connections
        self._connect_timeout_seconds = connect_timeout_seconds
        self._on_notify = on_notify
        self._opening = asyncio.Lock()
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._closed = False

    async def open(self) -> None:
        """Connect, create the schema if needed and start listening; a second call does nothing."""
        async with self._opening:
            self._check_open()
            if self._pool is not None:
                return
            listen_conn = await self._connect()
            try:
                await self._prepare_schema(listen_conn)
                await self._listen_on(listen_conn)
                pool = await self._open_pool()
            except BaseException:
                await listen_conn.close()
                raise
            self._pool = pool
            self._listener = asyncio.create_task(self._listen(listen_conn), name=f"{self.channel}-listen")

    async def close(self) -> None:
        async with self._opening:
            self._closed = True
            listener, self._listener = self._listener, None
            pool, self._pool = self._pool, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        if pool is not None:
            await pool.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection (opening the database first if needed).

        Failures of the server or the network become StoreUnavailableError (servers answer 503, which
        clients retry).
        """
        self._check_open()
        if self._pool is None:
            await self.open()
        pool = self._pool
        if pool is None:  # closed while opening
            raise ValidationError("the store is closed; open a new one")
        psycopg = import_psycopg()
        try:
            async with pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as error:
            raise StoreUnavailableError(
                f"PostgreSQL at {self.where()} failed: {error}; "
                "check that the server is running and reachable"
            ) from error

    async def transaction(self, conn: Connection, body: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``body`` in one transaction; retried when PostgreSQL aborts it for a deadlock."""
        psycopg = import_psycopg()
        tries = 0
        while True:
            tries += 1
            try:
                async with conn.transaction():
                    return await body(conn)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                if tries >= _TRANSACTION_TRIES:
                    raise
                logger.debug("transaction aborted by PostgreSQL (try %d); retrying", tries)

    async def notify(self, conn: Connection) -> None:
        """Notify every process's listener once the current transaction commits."""
        await conn.execute("SELECT pg_notify(%s, '')", (self.channel,))

    def where(self) -> str:
        """The server and database, for error messages (never the password)."""
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(self._conninfo)
        except ProgrammingError:  # unparsable: libpq's own message says why
            return "the configured server"
        host, port, dbname = params.get("host", "localhost"), params.get("port", 5432), params.get("dbname")
        return f"{host}:{port}/{dbname or params.get('user', '')}"

    def _check_open(self) -> None:
        if self._closed:
            raise ValidationError("the store is closed; open a new one")

    async def _connect(self) -> Connection:
        psycopg = import_psycopg()
        try:
            conn: Connection = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, connect_timeout=max(1, round(self._connect_timeout_seconds))
            )
        except psycopg.Error as error:
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL at {self.where()}: {error}; "
                "check the store URL and that the server is running"
            ) from error
        return conn

    async def _prepare_schema(self, conn: Connection) -> None:
        from psycopg import sql

        schema = sql.Identifier(self.schema)
        async with conn.transaction():
            # Processes opening one schema at once would race on CREATE ... IF NOT EXISTS.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))
            if self._create:
                await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            await conn.execute(sql.SQL("SET search_path TO {}").format(schema))
            missing = await self._missing_objects(conn)
            if self._create and missing:
                await conn.execute(SCHEMA_DDL)
            elif "rollouts" in missing:
                raise ConfigError(
                    f"no fulgor store in schema {self.schema!r} at {self.where()}; "
                    "check the store URL and its ?schema= parameter"
                )

    async def _missing_objects(self, conn: Connection) -> list[str]:
        """The schema's objects (in SCHEMA_DDL's order) that do not exist yet."""
        rows = await fetch(
            conn,
            "SELECT name FROM unnest(%s::text[]) AS o(name) WHERE to_regclass(name) IS NULL",
            (list(_SCHEMA_OBJECTS),),
        )
        return [row[0] for row in rows]

    async def _configure(self, conn: Connection) -> None:
        from psycopg import sql

        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))

    async def _open_pool(self) -> AsyncConnectionPool[Connection]:
        from psycopg_pool import AsyncConnectionPool, PoolTimeout

        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=self._max_connections,
            kwargs={"autocommit": True},
            configure=self._configure,
            timeout=self._connect_timeout_seconds,
            name=self.channel,
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=self._connect_timeout_seconds)
        except PoolTimeout as error:
            await pool.close()
            raise StoreUnavailableError(
                f"cannot open connections to PostgreSQL at {self.where()}: {error}; "
                "check the server's max_connections"
            ) from error
        return pool

    async def _listen_on(self, conn: Connection) -> None:
        from psycopg import sql

        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))

    async def _listen(self, conn: Connection) -> None:
        """Pass notifications on to ``on_notify``; reconnect when the link drops."""
        psycopg = import_psycopg()
        while True:
            try:
                async for _ in conn.notifies():
                    self._on_notify()
            except psycopg.Error as error:
                logger.warning("lost the LISTEN connection to %s (%s); reconnecting", self.where(), error)
            finally:
                await conn.close()
            conn = await self._reconnect_listener()
            # Changes made while disconnected sent notifications nobody heard: let waiters look again.
            self._on_notify()

    async def _reconnect_listener(self) -> Connection:
        psycopg = import_psycopg()
        tries = 0
        while True:
            await asyncio.sleep(_RECONNECT_SECONDS[min(tries, len(_RECONNECT_SECONDS) - 1)])
            tries += 1
            try:
                conn = await self._connect()
            except StoreUnavailableError as error:
                logger.warning("%s (try %d)", error, tries)
                continue
            try:
                await self._listen_on(conn)
            except BaseException as error:
                await conn.close()
                if not isinstance(error, psycopg.Error):
                    raise
                logger.warning("cannot LISTEN at %s: %s (try %d)", self.where(), error, tries)
                continue
            return conn


def import_psycopg() -> Any:
    """The psycopg module; an ImportError naming the extra when it or psycopg_pool is missing."""
    try:
        import psycopg
        import psycopg_pool  # noqa: F401  (part of the extra: fail here rather than when the pool opens)
    except ImportError as error:
        raise ImportError(
            "PostgresStore needs psycopg and psycopg_pool: pip install 'fulgor[postgres]'"
        ) from error
    return psycopg


async def fetch(conn: Connection, query: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
    """Run one statement and return all its rows."""
    cursor = await conn.execute(query, params)
    rows: list[Any] = await cursor.fetchall()
    return rows
