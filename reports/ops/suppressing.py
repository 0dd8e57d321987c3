"""Suppress a user by hand, or lift a suppression: what ``reports suppress add|remove`` and the
console's buttons do."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from reports import suppressions
from reports.errors import BadInput
from reports.feedback import store
from reports.models import SuppressionReason, User


def suppress(session: Session, user_id: int, reason: SuppressionReason, *, now: datetime, source: str) -> str | None:
    """Suppress the user; the reason they were already suppressed for (nothing changed), else ``None``.

    :class:`BadInput` for an unknown user.
    """
    if session.get(User, user_id) is None:
        raise BadInput(f"No user with id {user_id}.")
    existing = suppressions.get(session, user_id)
    if existing is not None:
        return existing.reason
    suppressions.add(session, user_id, reason, now=now, source=source)
    return None


@dataclass(frozen=True)
class Lifted:
    #: False when the user was not suppressed (nothing changed).
    removed: bool
    #: Provider feedback events about the user dismissed with it.
    dismissed: int = 0


def lift(session: Session, user_id: int, *, now: datetime) -> Lifted:
    """Lift the user's suppression, whatever its reason, and dismiss the provider feedback behind it."""
    if not suppressions.remove(session, user_id):
        return Lifted(removed=False)
    return Lifted(removed=True, dismissed=store.dismiss(session, user_id, now=now))
