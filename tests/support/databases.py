"""Databases: a PostgreSQL database of one's own (empty, or a copy of a template), dropped after;
users loaded by plain SQL."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from tests.support.environment import POSTGRES_ADMIN_URL


@contextlib.contextmanager
def temporary_database(
    admin_url: str = POSTGRES_ADMIN_URL, *, prefix: str = "reports_test", template: str | None = None
) -> Iterator[str]:
    """Create an empty database, or a copy of the database named ``template`` (which nobody may be
    connected to); yield its SQLAlchemy URL; drop it (and its connections) after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"{copy}')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Population:
    """Users loaded by plain SQL into the contract's schema, and what each should be told."""

    active: list[int] = field(default_factory=list)
    inactive: list[int] = field(default_factory=list)
    #: user id → (activity count, total in cents) within the period.
    expected: dict[int, tuple[int, int]] = field(default_factory=dict)


def load_users(
    sessions: sessionmaker[Session],
    *,
    count: int,
    period: str = "2026-10",
    inactive_every: int = 5,
    names: dict[int, str] | None = None,
    ids: Sequence[int] | None = None,
) -> Population:
    """Insert ``count`` users (every ``inactive_every``-th inactive) with activities, by plain SQL;
    or, with ``ids``, one active user per id (``count`` is then ignored).

    Each user ``i`` has ``i % 4`` activities in the period of ``100 * i`` cents each, one in the
    month before, and one in the month after (which must not be counted).
    """
    year, month = map(int, period.split("-"))
    inside, before = (
        f"{period}-15 12:00:00",
        f"{year if month > 1 else year - 1}-{(month - 2) % 12 + 1:02d}-20 08:00:00",
    )
    after = f"{year + month // 12}-{month % 12 + 1:02d}-01 00:00:00"
    population = Population()
    users, activities = [], []
    for user_id in range(1, count + 1) if ids is None else ids:
        active = ids is not None or user_id % inactive_every != 0
        (population.active if active else population.inactive).append(user_id)
        name = (names or {}).get(user_id, f"User {user_id}")
        users.append({"id": user_id, "email": f"user{user_id}@example.test", "name": name, "active": active})
        n = user_id % 4
        population.expected[user_id] = (n, n * 100 * user_id)
        for k in range(n):
            activities.append(
                {"user_id": user_id, "at": inside, "category": ("food", "travel")[k % 2], "amount": 100 * user_id}
            )
        activities.append({"user_id": user_id, "at": before, "category": "food", "amount": 555})
        activities.append({"user_id": user_id, "at": after, "category": "food", "amount": 777})
    with sessions.begin() as session:
        session.execute(text("INSERT INTO users (id, email, name, active) VALUES (:id, :email, :name, :active)"), users)
        session.execute(
            text(
                "INSERT INTO activities (user_id, occurred_at, category, amount_cents) "
                "VALUES (:user_id, :at, :category, :amount)"
            ),
            activities,
        )
    return population


def in_autocommit(connection: Any) -> bool:
    """Whether a SQLAlchemy connection's statements each run as a transaction by themselves: psycopg's
    flag, which SQLAlchemy's begin and commit events do not show (sqlite3 has none before Python 3.12,
    and the engine begins SQLite's transactions itself)."""
    return bool(getattr(connection.connection.dbapi_connection, "autocommit", False))


def pg_connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A plain psycopg connection in autocommit to a database named by a SQLAlchemy URL
    (``postgresql+psycopg://…``), for what a test or a bench reads or runs outside the code under test."""
    return psycopg.connect(url.replace("+psycopg", ""), autocommit=True)
