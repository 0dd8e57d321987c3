"""A period's progress, counted from the durable state of its items (never from the queue)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
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
    return _progress(str(period), planned, by_state)


@dataclass(frozen=True)
class PeriodSummary:
    progress: Progress
    #: The run's state: ``active`` or ``cancelled``.
    state: str
    triggered_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {**self.progress.as_dict(), "state": self.state,
                "triggered_at": self.triggered_at.isoformat(timespec="seconds") + "Z"}


def every_period(session: Session) -> list[PeriodSummary]:
    """Every period ever triggered, newest first, with its counts (one grouped query)."""
    counts: dict[str, dict[str, int]] = {}
    for period, state, n in session.execute(
        select(ReportItem.period, ReportItem.state, func.count()).group_by(ReportItem.period, ReportItem.state)
    ):
        counts.setdefault(period, {})[state] = n
    summaries = []
    for run in session.scalars(select(PeriodRun).order_by(PeriodRun.period.desc())):
        by_state = counts.get(run.period, {})
        summaries.append(PeriodSummary(
            progress=_progress(run.period, run.planned, by_state), state=run.state, triggered_at=run.triggered_at,
        ))
    return summaries


def _progress(period: str, planned: bool, by_state: dict[str, int]) -> Progress:
    return Progress(
        period=period,
        total=sum(by_state.values()),
        planned=bool(planned),
        delivered=by_state.get(ItemState.DELIVERED, 0),
        skipped=by_state.get(ItemState.SKIPPED, 0),
        dead=by_state.get(ItemState.DEAD, 0),
        pending=by_state.get(ItemState.PENDING, 0),
    )
