"""Dialect-aware statements that PostgreSQL and SQLite both run through the same code path."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Connection, CursorResult, FromClause, Result
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

#: What a statement runs on: an ORM session, or a bare connection where the session's bookkeeping
#: would cost more than the statement (the per-report path on PostgreSQL).
Executor = Session | Connection


def dialect_name(executor: Executor) -> str:
    return executor.dialect.name if isinstance(executor, Connection) else executor.get_bind().dialect.name


def dialect_insert(session: Executor, table: FromClause):
    """The session's dialect's INSERT, the one with ``on_conflict_do_nothing`` and ``on_conflict_do_update``."""
    dialect = dialect_name(session)
    module = {"postgresql": postgresql, "sqlite": sqlite}.get(dialect)
    if module is None:
        raise NotImplementedError(f"Unsupported database dialect {dialect!r}.")
    return module.insert(table)


def insert_ignoring_conflicts(session: Executor, table: FromClause):
    """``INSERT … ON CONFLICT DO NOTHING`` for the session's dialect."""
    return dialect_insert(session, table).on_conflict_do_nothing()


def upsert(session: Executor, table: FromClause, values: dict, *, key: list[str]):
    """``INSERT … ON CONFLICT (key) DO UPDATE`` setting every non-key column from ``values``."""
    statement = dialect_insert(session, table).values(values)
    return statement.on_conflict_do_update(
        index_elements=key, set_={column: statement.excluded[column] for column in values if column not in key}
    )


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE touched (``Session.execute`` types its result as the general kind)."""
    return cast(CursorResult[Any], result).rowcount
