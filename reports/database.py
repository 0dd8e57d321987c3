"""Engines, sessions and migrations for the configured database."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, exc, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from reports.errors import DatabaseMissing
from reports.settings import Settings

if TYPE_CHECKING:
    import sqlite3

    # Alembic is imported only where a migration runs: every worker imports this module for its
    # engine, and importing Alembic (1.16+) logs seven INFO lines of plugin set-up per process.
    from alembic.config import Config
    from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

_MIGRATIONS = Path(__file__).resolve().parent / "migrations"

#: How long a SQLite writer waits for another writer before failing, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 30_000


#: Bound parameters (names, addresses, amounts) stay out of SQLAlchemy's error text, which lands
#: in dead letters, item errors and logs.
HIDE_PARAMETERS = True

#: Idle PostgreSQL connections a process keeps: at least the threads of any worker pool.
IDLE_CONNECTIONS_KEPT = 16

#: A PostgreSQL connection idle in the pool longer than this, in seconds, is pinged before it is
#: handed out; one given back more recently is handed out as it is.
PING_AFTER_IDLE_SECONDS = 1.0


def create_db_engine(url: str, *, create: bool = True) -> Engine:
    """Create an engine; SQLite gets WAL and write-intent transactions for many worker processes.

    :param create: whether a SQLite file (and its folder) may be created; without it a missing
        file raises :class:`DatabaseMissing` instead of becoming an empty database.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # Pools open connections only as threads ask for them, but keep no more than pool_size
        # idle: below a worker's thread count (8 on the bulk pool), every busy moment opened and
        # closed connections (docs/benchmarks.md, "End to end").
        # A driver that is not installed was refused with the settings (reports.endpoints).
        engine = create_engine(url, pool_size=IDLE_CONNECTIONS_KEPT, hide_parameters=HIDE_PARAMETERS)
        _ping_after_idle(engine)
        return engine

    if parsed.database and parsed.database != ":memory:":
        if not create and not Path(parsed.database).is_file():
            # Absolute: a relative path (the default var/reports.db) is read from the current
            # folder, and the operator must see which folder that was.
            raise DatabaseMissing(
                f"No database at {Path(parsed.database).resolve()}: set DATABASE_URL (or VAR_DIR, "
                "which holds the default reports.db) to an existing one, or create it with "
                "`reports db upgrade`."
            )
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, hide_parameters=HIDE_PARAMETERS
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy's "begin" event open transactions, so they can be IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # A deferred transaction that reads and then writes fails at once with "database is
        # locked" when another process wrote in between; IMMEDIATE waits for the lock instead.
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _ping_after_idle(engine: Engine) -> None:
    """Ping a connection before it is handed out only when it sat idle in the pool for a while.

    What breaks a pooled connection (a restarted server, a proxy's or firewall's idle timeout)
    happens while it sits idle; a connection given back a moment ago by a busy worker is still
    good, and pinging it anyway was a round trip (and a statement on the server) per message. A
    connection that broke all the same fails its first statement, which invalidates it (and the
    pool's older ones): the message is retried, and recording a send retries by itself.
    """

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _handed_out(dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection) -> None:
        returned_at = record.info.get("returned_at")  # none yet: a connection just made
        if returned_at is None or time.monotonic() - returned_at <= PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            # The pool replaces the connection and tries again (SQLAlchemy's own pre-ping does the same).
            raise exc.DisconnectionError() from error


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL, as written (relative paths are read from the current folder);
    ``None`` for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


#: How long a migration waits for each lock it needs on PostgreSQL, in milliseconds.
MIGRATION_LOCK_TIMEOUT_MS = 10_000

#: PostgreSQL's lock_not_available: a lock timeout ran out.
LOCK_NOT_AVAILABLE = "55P03"


def upgrade(settings: Settings, revision: str = "head") -> None:
    """Migrate the configured database to ``revision``."""
    from alembic import command

    _migrate(settings, command.upgrade, revision)


def downgrade(settings: Settings, revision: str) -> None:
    """Migrate the configured database back to ``revision`` (the migrations' tests go both ways)."""
    from alembic import command

    _migrate(settings, command.downgrade, revision)


def _migrate(settings: Settings, move: Callable[[Config, str], None], revision: str) -> None:
    engine = create_db_engine(settings.database_url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # A migration waiting for a table's lock behind a long transaction would queue
                # every worker's statement on that table behind it: the fleet would stop until
                # then. Past this wait it gives up instead, having changed nothing.
                connection.execute(text(f"SET LOCAL lock_timeout = {MIGRATION_LOCK_TIMEOUT_MS}"))
            config = alembic_config(settings.database_url)
            config.attributes["connection"] = connection
            move(config, revision)
    finally:
        engine.dispose()
