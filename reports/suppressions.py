"""The suppression list's SQL: add, remove, read, count. The caller owns the session.

The hot paths do not call this module: the per-user read (:mod:`reports.delivery.statements`) and the
coordinator's page (:mod:`reports.fanout.coordinator`) fold their look-up into the statements they run.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, literal, select
from sqlalchemy.orm import Session

from reports import sql
from reports.models import Suppression, SuppressionReason, User
from reports.sql import Executor, insert_ignoring_conflicts, rowcount

#: Longest ``source`` kept, in characters.
SOURCE_LIMIT = 200


def add(
    session: Executor,
    user_id: int,
    reason: SuppressionReason,
    *,
    now: datetime,
    source: str | None,
    provider: str | None = None,
    event_id: str | None = None,
) -> bool:
    """Suppress the user if they exist and are not suppressed yet; ``True`` if this added the entry.

    ``provider`` and ``event_id`` name the provider's webhook event that suppressed the user.

    An existing entry is kept as it is: the first reason stays (a bounce is not turned into an
    unsubscribe that the user could lift by resubscribing).
    """
    added = session.execute(
        insert_ignoring_conflicts(session, Suppression.__table__)
        .from_select(
            ["user_id", "reason", "created_at", "source", "provider", "event_id"],
            select(
                User.id,
                literal(reason.value),
                literal(now, Suppression.created_at.type),
                literal(source[:SOURCE_LIMIT] if source else None, Suppression.source.type),
                literal(provider, Suppression.provider.type),
                literal(event_id, Suppression.event_id.type),
            ).where(User.id == user_id),
        )
        .returning(Suppression.__table__.c.user_id)
    ).first()
    # RETURNING, not the row count: psycopg reports -1 for an INSERT … SELECT … ON CONFLICT.
    return added is not None


@dataclass(frozen=True)
class Entry:
    """One user to suppress, and why: what :func:`add_many` takes."""

    user_id: int
    reason: SuppressionReason
    source: str | None
    provider: str | None = None
    event_id: str | None = None


def add_many(session: Executor, entries: Sequence[Entry], *, now: datetime) -> list[int]:
    """Suppress each entry's user who is not suppressed yet, in one statement; the users this added.

    The users must exist (a provider's batch, matched to users in the same transaction). As with
    :func:`add`, an existing entry is kept as it is, and the first entry for a user wins.
    """
    first = list({entry.user_id: entry for entry in reversed(entries)}.values())[::-1]
    if not first:
        return []
    added = session.execute(
        insert_ignoring_conflicts(session, Suppression.__table__)
        .values(
            [
                {
                    "user_id": entry.user_id,
                    "reason": entry.reason.value,
                    "created_at": now,
                    "source": entry.source[:SOURCE_LIMIT] if entry.source else None,
                    "provider": entry.provider,
                    "event_id": entry.event_id,
                }
                for entry in first
            ]
        )
        .returning(Suppression.__table__.c.user_id)
    )
    return [int(user_id) for (user_id,) in added]


def remove(session: Session, user_id: int, *, reason: SuppressionReason | None = None) -> bool:
    """Lift the user's suppression (only if it has ``reason``, when given); ``True`` if there was one."""
    statement = delete(Suppression).where(Suppression.user_id == user_id)
    if reason is not None:
        statement = statement.where(Suppression.reason == reason.value)
    return rowcount(session.execute(statement)) > 0


def among(session: Session, user_ids: Collection[int]) -> set[int]:
    """Which of ``user_ids`` (a few hundred at most: one parameter each) are on the suppression list."""
    return set(session.scalars(select(Suppression.user_id).where(Suppression.user_id.in_(sorted(user_ids)))))


def get(session: Session, user_id: int) -> Suppression | None:
    return session.get(Suppression, user_id)


def find(
    session: Session, *, reason: SuppressionReason | None = None, limit: int | None = None
) -> Iterator[Suppression]:
    """The entries, lowest user id first, read a page at a time as they are used."""
    statement = select(Suppression).order_by(Suppression.user_id).limit(limit).execution_options(yield_per=1000)
    if reason is not None:
        statement = statement.where(Suppression.reason == reason.value)
    yield from session.scalars(statement)


def count_by_reason(session: Session) -> dict[str, int]:
    """Entries per reason, every reason present (0 when none)."""
    counts = dict(session.execute(select(Suppression.reason, func.count()).group_by(Suppression.reason)).all())
    return {reason.value: int(counts.get(reason.value, 0)) for reason in SuppressionReason}


def search(
    session: Session, *, user_id: int | None = None, address: str | None = None, after: int | None = None, limit: int
) -> list[tuple[Suppression, str]]:
    """Entries with their user's address, lowest user id first after ``after`` (``None``: from the
    lowest): the user ``user_id``'s, the users whose address is ``address`` (any case), or every
    one; a keyset page of ``limit``."""
    statement = select(Suppression, User.email).join(User, User.id == Suppression.user_id)
    if user_id is not None:
        statement = statement.where(Suppression.user_id == user_id)
    if address is not None:
        statement = statement.where(func.lower(User.email) == address.lower())
    # The cursor on both sides of the join: on the suppressions' side alone, PostgreSQL merged it
    # with the users from the lowest id, and each page took longer than the one before.
    statement = (
        statement.where(sql.after(Suppression.user_id, after), sql.after(User.id, after))
        .order_by(Suppression.user_id)
        .limit(limit)
    )
    return [(entry, email) for entry, email in session.execute(statement)]
