"""Dialect-aware statements that PostgreSQL and SQLite both run through the same code path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, FromClause, Result, TableClause
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

#: The dialects' own INSERT, each with ``on_conflict_do_nothing`` and ``on_conflict_do_update``.
DialectInsert = postgresql.Insert | sqlite.Insert

#: What a statement runs on: an ORM session, or a bare connection where the session's bookkeeping
#: would cost more than the statement (the per-report path on PostgreSQL).
Executor = Session | Connection


def dialect_name(executor: Executor) -> str:
    return executor.dialect.name if isinstance(executor, Connection) else executor.get_bind().dialect.name


def dialect_insert(session: Executor, table: FromClause) -> DialectInsert:
    """The session's dialect's INSERT, the one with ``on_conflict_do_nothing`` and ``on_conflict_do_update``."""
    if not isinstance(table, TableClause):
        # A mapped class's ``__table__`` is typed as any FromClause; only a table takes an INSERT.
        raise TypeError(f"Cannot insert into {table!r}: it is not a table.")
    dialect = dialect_name(session)
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"Unsupported database dialect {dialect!r}.")


def insert_ignoring_conflicts(session: Executor, table: FromClause) -> DialectInsert:
    """``INSERT … ON CONFLICT DO NOTHING`` for the session's dialect."""
    return dialect_insert(session, table).on_conflict_do_nothing()


def upsert(session: Executor, table: FromClause, values: Mapping[str, object], *, key: list[str]) -> DialectInsert:
    """``INSERT … ON CONFLICT (key) DO UPDATE`` setting every non-key column from ``values``."""
    statement = dialect_insert(session, table).values(values)
    return statement.on_conflict_do_update(
        index_elements=key, set_={column: statement.excluded[column] for column in values if column not in key}
    )


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE touched (``Session.execute`` types its result as the general kind)."""
    return cast(CursorResult[Any], result).rowcount
