"""A user's activity for a period and the month before: one grouped query, then pure arithmetic."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import case, func, select

from reports.models import Activity
from reports.periods import Period
from reports.sql import Executor, comparable_time


@dataclass(frozen=True)
class CategoryTotal:
    category: str
    count: int
    total_cents: int


@dataclass(frozen=True)
class Summary:
    period: Period
    count: int
    total_cents: int
    by_category: tuple[CategoryTotal, ...]
    previous_total_cents: int

    @property
    def change_cents(self) -> int:
        return self.total_cents - self.previous_total_cents

    @property
    def change_percent(self) -> float | None:
        """Change against the previous month in percent; ``None`` when that month had nothing."""
        if self.previous_total_cents == 0:
            return None
        return 100.0 * self.change_cents / abs(self.previous_total_cents)


#: One row of the grouped query: (is in the period, category, count, total in cents).
Row = tuple[bool, str, int, int]


def summarize(period: Period, rows: Iterable[Row]) -> Summary:
    """Fold the grouped rows into the report's figures; categories by total, largest first."""
    current: list[CategoryTotal] = []
    previous_total = 0
    for in_period, category, count, total in rows:
        if in_period:
            current.append(CategoryTotal(category, int(count), int(total)))
        else:
            previous_total += int(total)
    current.sort(key=lambda c: (-c.total_cents, c.category))
    return Summary(
        period=period,
        count=sum(c.count for c in current),
        total_cents=sum(c.total_cents for c in current),
        by_category=tuple(current),
        previous_total_cents=previous_total,
    )


def load_summary(session: Executor, user_id: int, period: Period) -> Summary:
    occurred_at, start = comparable_time(Activity.occurred_at), comparable_time(period.start)
    in_period = case((occurred_at >= start, True), else_=False).label("in_period")
    rows = session.execute(
        select(in_period, Activity.category, func.count(), func.coalesce(func.sum(Activity.amount_cents), 0))
        .where(
            Activity.user_id == user_id,
            occurred_at >= comparable_time(period.previous().start),
            occurred_at < comparable_time(period.end),
        )
        .group_by(in_period, Activity.category)
    )
    return summarize(period, ((bool(r[0]), r[1], r[2], r[3]) for r in rows))
