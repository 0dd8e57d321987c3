"""The per-report statements behind one port, with an adapter per database (chosen by :func:`open_store`)."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from reports.delivery.store.port import Inputs, ReadAndClaim, Store, StoredReport, Transaction, keep_report
from reports.delivery.store.postgresql import PostgresStore
from reports.delivery.store.sqlite import SqliteStore

__all__ = [
    "Inputs",
    "PostgresStore",
    "ReadAndClaim",
    "SqliteStore",
    "Store",
    "StoredReport",
    "Transaction",
    "keep_report",
    "open_store",
]


def open_store(sessions: sessionmaker[Session]) -> Store:
    """The adapter for the sessions' database, chosen once when the process builds its context."""
    engine: Engine = sessions.kw["bind"]
    if engine.dialect.name == "postgresql":
        return PostgresStore(engine)
    if engine.dialect.name == "sqlite":
        return SqliteStore(sessions)
    raise NotImplementedError(f"Unsupported database dialect {engine.dialect.name!r}.")
