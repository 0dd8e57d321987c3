"""Demo data: users with a month (and the month before) of activities, reproducibly random."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from reports.errors import BadInput
from reports.jobs import MAX_USER_ID
from reports.models import Activity, User
from reports.periods import Period

CATEGORIES = ("groceries", "transport", "dining", "utilities", "entertainment", "health")
_FIRST_NAMES = ("Aziz", "Dilnoza", "Emre", "Elif", "Maria", "Jon", "Lena", "Kenji", "Amara", "Noah")
#: Rows per INSERT batch.
_BATCH = 5_000


@dataclass(frozen=True)
class Seeded:
    users: int
    inactive: int
    activities: int
    first_id: int
    last_id: int


def seed(session: Session, *, users: int, period: Period, inactive_percent: int = 10, seed: int = 1) -> Seeded:
    """Add ``users`` users after the highest existing id, with activities in ``period`` and the month before."""
    rng = random.Random(seed)
    first_id = (session.scalar(select(func.max(User.id))) or 0) + 1
    if first_id + users - 1 > MAX_USER_ID:
        raise BadInput(
            f"Only {max(MAX_USER_ID - first_id + 1, 0):,} more user(s) fit: user ids end at "
            f"{MAX_USER_ID:,} and the highest is {first_id - 1:,}."
        )
    next_activity = (session.scalar(select(func.max(Activity.id))) or 0) + 1
    user_rows, activity_rows, inactive = [], [], 0
    for user_id in range(first_id, first_id + users):
        active = rng.randrange(100) >= inactive_percent
        inactive += not active
        user_rows.append(
            {
                "id": user_id,
                "email": f"user{user_id}@example.test",
                "name": f"{rng.choice(_FIRST_NAMES)} {user_id}",
                "active": active,
            }
        )
        for month in (period.previous(), period):
            days = (month.end - month.start).days
            for _ in range(rng.randrange(0, 7)):
                activity_rows.append(
                    {
                        "id": next_activity,
                        "user_id": user_id,
                        "occurred_at": month.start + timedelta(days=rng.randrange(days), seconds=rng.randrange(86_400)),
                        "category": rng.choice(CATEGORIES),
                        "amount_cents": rng.randrange(100, 20_000),
                    }
                )
                next_activity += 1
    for table, rows in ((User, user_rows), (Activity, activity_rows)):
        for start in range(0, len(rows), _BATCH):
            session.execute(insert(table), rows[start : start + _BATCH])
    return Seeded(users, inactive, len(activity_rows), first_id, first_id + users - 1)
