"""A period's progress, counted from the durable state of its items (never from the queue)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from reports.errors import BadInput
from reports.models import ItemState, PeriodRun, ReportItem
from reports.periods import Period


@dataclass(frozen=True)
class Progress:
    period: str
    #: Items recorded so far; grows while the coordinator walks.
    total: int
    #: True once the coordinator has walked every active user.
    planned: bool
    delivered: int
    skipped: int
    dead: int
    pending: int

    @property
    def finished(self) -> int:
        return self.delivered + self.skipped + self.dead

    @property
    def complete(self) -> bool:
        return self.planned and self.pending == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}


def count(session: Session, period: Period) -> Progress:
    """Count the period's items by state; :class:`BadInput` if the period was never triggered."""
    planned = session.scalar(select(PeriodRun.planned).where(PeriodRun.period == str(period)))
    if planned is None:
        raise BadInput(f"Period {period} has never been triggered.")
    by_state = dict(
        session.execute(
            select(ReportItem.state, func.count()).where(ReportItem.period == str(period)).group_by(ReportItem.state)
        ).all()
    )
    return Progress(
        period=str(period),
        total=sum(by_state.values()),
        planned=bool(planned),
        delivered=by_state.get(ItemState.DELIVERED, 0),
        skipped=by_state.get(ItemState.SKIPPED, 0),
        dead=by_state.get(ItemState.DEAD, 0),
        pending=by_state.get(ItemState.PENDING, 0),
    )
