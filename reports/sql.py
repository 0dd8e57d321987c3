"""Dialect-aware statements that PostgreSQL and SQLite both run through the same code path."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, FromClause, Result
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def dialect_insert(session: Session, table: FromClause):
    """The session's dialect's INSERT, the one with ``on_conflict_do_nothing`` and ``on_conflict_do_update``."""
    dialect = session.get_bind().dialect.name
    module = {"postgresql": postgresql, "sqlite": sqlite}.get(dialect)
    if module is None:
        raise NotImplementedError(f"Unsupported database dialect {dialect!r}.")
    return module.insert(table)


def insert_ignoring_conflicts(session: Session, table: FromClause):
    """``INSERT … ON CONFLICT DO NOTHING`` for the session's dialect."""
    return dialect_insert(session, table).on_conflict_do_nothing()


def upsert(session: Session, table: FromClause, values: dict, *, key: list[str]):
    """``INSERT … ON CONFLICT (key) DO UPDATE`` setting every non-key column from ``values``."""
    statement = dialect_insert(session, table).values(values)
    return statement.on_conflict_do_update(
        index_elements=key, set_={column: statement.excluded[column] for column in values if column not in key}
    )


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE touched (``Session.execute`` types its result as the general kind)."""
    return cast(CursorResult[Any], result).rowcount
