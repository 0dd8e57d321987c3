"""A period's progress, counted from the durable state of its items (never from the queue).

The counts are the ones the database keeps in ``item_counts`` as items change (see
:class:`reports.models.ItemCount`): a read costs the same at a thousand items as at a million.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ScalarSelect, case, exists, func, select
from sqlalchemy.orm import Session

from reports import items
from reports.errors import BadInput
from reports.models import RECORDED, DueCount, ItemCount, ItemState, PeriodRun, RunState
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
    #: The run's state: ``active``, or ``cancelled`` while an operator has it stopped (a cancelled
    #: period does not complete until ``reports trigger`` resumes it).
    state: str = RunState.ACTIVE
    #: The part of ``pending`` not yet due: waiting for its user's morning. ``None`` for a run
    #: triggered without ``SEND_AT_LOCAL_TIME`` (or when not counted), and then left out of the JSON.
    scheduled: int | None = None

    @property
    def finished(self) -> int:
        return self.delivered + self.skipped + self.dead

    @property
    def complete(self) -> bool:
        return self.planned and self.pending == 0

    @property
    def cancelled(self) -> bool:
        return self.state == RunState.CANCELLED

    @property
    def status(self) -> str:
        """What an operator reads: ``complete`` for a finished active run, else the run's state.

        The JSON keeps ``state`` as the run's own (``active``/``cancelled``) next to ``complete``,
        so scripts that read it see no change; a person reading "active" for a month that is done
        would look for work that is not there.
        """
        return "complete" if self.state == RunState.ACTIVE and self.complete else self.state

    def as_dict(self) -> dict[str, Any]:
        counts = {**asdict(self), "complete": self.complete}
        if self.scheduled is None:
            del counts["scheduled"]
        return counts

    def line(self) -> str:
        """The counts as one plain line: nothing to cut on a narrow terminal, easy to grep."""
        scheduled = f", of them scheduled {self.scheduled}" if self.scheduled else ""
        return (
            f"{self.finished}/{self.total} finished (delivered {self.delivered}, skipped {self.skipped}, "
            f"dead {self.dead}, pending {self.pending}{scheduled}); planned={str(self.planned).lower()} "
            f"complete={str(self.complete).lower()}"
        )


def count(session: Session, period: Period, now: datetime | None = None) -> Progress:
    """Count the period's items by state, and with ``now`` those of a run with a send time not yet
    due at it; :class:`BadInput` if the period was never triggered."""
    run = session.execute(
        select(PeriodRun.planned, PeriodRun.state, PeriodRun.send_at).where(PeriodRun.period == str(period))
    ).one_or_none()
    if run is None:
        raise BadInput(f"Period {period} has never been triggered.")
    planned, state, send_at = run
    counted = _progress(str(period), planned, state, items_by_state(session, [str(period)]).get(str(period), {}))
    if now is None or send_at is None:
        return counted
    return replace(counted, scheduled=scheduled(session, period, now))


def scheduled(session: Session, period: Period, now: datetime) -> int:
    """The period's pending items not yet due at ``now``, summed over the counts the database keeps
    by due time (:class:`reports.models.DueCount`): a few dozen rows, however many items wait."""
    return scheduled_by_period(session, now, [str(period)]).get(str(period), 0)


def waiting(session: Session, period: Period) -> bool:
    """Whether any of the period's pending items waits to be released, due or not."""
    return bool(session.scalar(select(exists().where(*items.waiting(period)))))


def items_by_state(session: Session, periods: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Items by period and state, for ``periods`` (every period when ``None``)."""
    statement = select(ItemCount.period, ItemCount.counter, func.sum(ItemCount.n)).group_by(
        ItemCount.period, ItemCount.counter
    )
    if periods is not None:
        statement = statement.where(ItemCount.period.in_(periods))
    counters: dict[str, dict[str, int]] = {}
    for period, counter, n in session.execute(statement):
        counters.setdefault(period, {})[counter] = int(n)
    states = {}
    for period, counted in counters.items():
        recorded = counted.pop(RECORDED, 0)
        states[period] = {**counted, ItemState.PENDING: recorded - sum(counted.values())}
    return states


def pending(period: str) -> ScalarSelect[int]:
    """The period's pending items as one SQL value, recorded less finished as in :func:`items_by_state`,
    for a check inside another statement."""
    return (
        select(func.coalesce(func.sum(case((ItemCount.counter == RECORDED, ItemCount.n), else_=-ItemCount.n)), 0))
        .where(ItemCount.period == period)
        .scalar_subquery()
    )


@dataclass(frozen=True)
class PeriodSummary:
    progress: Progress
    triggered_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {**self.progress.as_dict(), "triggered_at": self.triggered_at.isoformat(timespec="seconds") + "Z"}


def every_period(session: Session, now: datetime | None = None) -> list[PeriodSummary]:
    """Every period ever triggered, newest first, with its counts (one grouped query), and with
    ``now`` those not yet due at it (one more)."""
    counts = items_by_state(session)
    waiting = scheduled_by_period(session, now) if now is not None else {}
    summaries = []
    for run in session.scalars(select(PeriodRun).order_by(PeriodRun.period.desc())):
        by_state = counts.get(run.period, {})
        summaries.append(
            PeriodSummary(
                progress=replace(
                    _progress(run.period, run.planned, run.state, by_state),
                    scheduled=None if run.send_at is None or now is None else waiting.get(run.period, 0),
                ),
                triggered_at=run.triggered_at,
            )
        )
    return summaries


def scheduled_by_period(session: Session, now: datetime, periods: list[str] | None = None) -> dict[str, int]:
    """Each period's (of ``periods``, or every one's) pending items not yet due at ``now``, as
    :func:`scheduled` counts them; a period with none may be left out."""
    statement = select(DueCount.period, func.sum(DueCount.n)).where(DueCount.due_at > now).group_by(DueCount.period)
    if periods is not None:
        statement = statement.where(DueCount.period.in_(periods))
    return {period: int(n) for period, n in session.execute(statement)}


def _progress(period: str, planned: bool, state: str, by_state: dict[str, int]) -> Progress:
    return Progress(
        period=period,
        total=sum(by_state.values()),
        planned=bool(planned),
        state=state,
        delivered=by_state.get(ItemState.DELIVERED, 0),
        skipped=by_state.get(ItemState.SKIPPED, 0),
        dead=by_state.get(ItemState.DEAD, 0),
        pending=by_state.get(ItemState.PENDING, 0),
    )
