"""Dialect-aware statements that PostgreSQL and SQLite both run through the same code path."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    CursorResult,
    DateTime,
    FromClause,
    Result,
    TableClause,
    func,
    literal,
    true,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import QueryableAttribute, Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import SQLCoreOperations
from sqlalchemy.sql.functions import FunctionElement

#: The dialects' own INSERT, each with ``on_conflict_do_nothing`` and ``on_conflict_do_update``.
DialectInsert = postgresql.Insert | sqlite.Insert

#: What a statement runs on: an ORM session, or a bare connection where the session's bookkeeping
#: would cost more than the statement (the per-report path on PostgreSQL).
Executor = Session | Connection


def after(column: SQLCoreOperations[int], cursor: int | None) -> ColumnElement[bool]:
    """A keyset walk's condition: ``column > cursor``, and no condition while ``cursor`` is ``None``,
    so that the first page starts before any id (0 and negative ids are ids too)."""
    return true() if cursor is None else column > cursor


#: The PostgreSQL server's clock as the naive UTC timestamp the schema stores. ``clock_timestamp()``,
#: not ``now()``: a lease taken after a wait for a row lock starts when the lock is granted.
POSTGRESQL_NOW = "timezone('UTC', clock_timestamp())"

#: SQLite's clock (milliseconds, UTC) in the text SQLAlchemy stores a DateTime as
#: (``YYYY-MM-DD HH:MM:SS.ffffff``), so that stored times and this one compare as text.
_SQLITE_NOW_FORMAT = "%Y-%m-%d %H:%M:%f000"


def server_now(plus_seconds: float = 0.0) -> ServerNow:
    """The database server's time, ``plus_seconds`` on, as a SQL expression of the schema's timestamps.

    Every delivery lease is written and compared on it: workers on machines whose clocks disagree
    then agree on when a lease ends. On SQLite, which runs on one machine, it is that machine's clock.
    """
    return ServerNow(literal(float(plus_seconds)))


class ServerNow(FunctionElement[datetime]):
    """:func:`server_now`, compiled for each dialect below."""

    type = DateTime()
    inherit_cache = True


@compiles(ServerNow, "postgresql")
def _postgresql_now(element: ServerNow, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({POSTGRESQL_NOW} + make_interval(secs => {compiler.process(element.clauses, **kw)}))"


@compiles(ServerNow, "sqlite")
def _sqlite_now(element: ServerNow, compiler: SQLCompiler, **kw: Any) -> str:
    [seconds] = element.clauses
    return compiler.process(func.strftime(_SQLITE_NOW_FORMAT, "now", seconds.concat(" seconds")), **kw)


def comparable_time(timestamp: ColumnElement[datetime] | QueryableAttribute[datetime] | datetime) -> ComparableTime:
    """A timestamp (a column, or a bound value) written so that timestamps compare in time order.

    SQLite keeps timestamps as text in whatever form the writer used ('2026-10-01 00:00:00',
    '…T…', with or without fractions), and text compares character by character: there both sides
    go through ``datetime()``, which keeps month boundaries exact for rows loaded by plain SQL.
    """
    return ComparableTime(literal(timestamp, DateTime()) if isinstance(timestamp, datetime) else timestamp)


class ComparableTime(FunctionElement[datetime]):
    """:func:`comparable_time`, compiled for each dialect below."""

    type = DateTime()
    inherit_cache = True


@compiles(ComparableTime)
def _as_stored(element: ComparableTime, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(ComparableTime, "sqlite")
def _sqlite_normalized(element: ComparableTime, compiler: SQLCompiler, **kw: Any) -> str:
    return f"datetime({compiler.process(element.clauses, **kw)})"


def _dialect_name(executor: Executor) -> str:
    return executor.dialect.name if isinstance(executor, Connection) else executor.get_bind().dialect.name


def insert_on_conflict(session: Executor, table: FromClause) -> DialectInsert:
    """The session's dialect's INSERT, the one with ``on_conflict_do_nothing`` and ``on_conflict_do_update``."""
    if not isinstance(table, TableClause):
        # A mapped class's ``__table__`` is typed as any FromClause; only a table takes an INSERT.
        raise TypeError(f"Cannot insert into {table!r}: it is not a table.")
    dialect = _dialect_name(session)
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"Unsupported database dialect {dialect!r}.")


def insert_ignoring_conflicts(session: Executor, table: FromClause) -> DialectInsert:
    """``INSERT … ON CONFLICT DO NOTHING`` for the session's dialect."""
    return insert_on_conflict(session, table).on_conflict_do_nothing()


def upsert(session: Executor, table: FromClause, values: Mapping[str, object], *, key: list[str]) -> DialectInsert:
    """``INSERT … ON CONFLICT (key) DO UPDATE`` setting every non-key column from ``values``."""
    statement = insert_on_conflict(session, table).values(values)
    return statement.on_conflict_do_update(
        index_elements=key, set_={column: statement.excluded[column] for column in values if column not in key}
    )


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE touched (``Session.execute`` types its result as the general kind)."""
    return cast(CursorResult[Any], result).rowcount
