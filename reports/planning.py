"""The coordinator: walk a period's active users in keyset pages and enqueue one job per user.

Each page is one short transaction under the run's row lock. It records the page's items in
the database itself (INSERT … SELECT, one per user under the unique (period, user) key), hands
every item in the page's id range that has no ``enqueued_at`` to the broker, stamps it, and
advances the cursor. A crash before the commit leaves nothing of the page: the next run walks
it again. A crash after sending but before the commit re-sends on the next run, which the
consumer's delivery claim absorbs. Two coordinators at once serialize on the row lock, and the
second finds the cursor moved and continues from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import DateTime, func, literal, select, update
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.errors import PermanentError
from reports.jobs import ReportJob
from reports.models import ItemState, PeriodRun, ReportItem, RunState, User
from reports.periods import Period
from reports.sql import dialect_insert

#: Hands a batch of report-job payloads to the broker.
SendJobs = Callable[[Iterable[dict[str, Any]]], int]


class UnknownRun(PermanentError):
    """The period has no run: it was never triggered."""


@dataclass
class SliceOutcome:
    pages: int = 0
    enqueued: int = 0
    cursor: int = 0
    planned: bool = False
    #: The period was cancelled: the walk stopped, and is not to be continued until resumed.
    cancelled: bool = False
    #: The walk paused because the queue held ``high_water`` messages or more.
    backlogged: bool = False


def plan_slice(
    sessions: sessionmaker[Session],
    period: Period,
    send_jobs: SendJobs,
    *,
    page_size: int,
    budget_seconds: float,
    should_stop: Callable[[], bool] = lambda: False,
    backlog: Callable[[], int] | None = None,
    high_water: int = 0,
) -> SliceOutcome:
    """Walk pages until the period is planned, ``budget_seconds`` have passed or ``should_stop()``,
    or ``backlog()`` (messages waiting) reaches ``high_water``.

    The caller re-enqueues the coordinator when the outcome is not ``planned`` (with a delay when
    it is ``backlogged``).
    """
    deadline = time.monotonic() + budget_seconds
    outcome = SliceOutcome()
    while True:
        if backlog is not None and backlog() >= high_water:
            outcome.backlogged = True
            return outcome
        planned = _plan_page(sessions, period, page_size, send_jobs, outcome)
        if planned is None:
            outcome.cancelled = True
            return outcome
        outcome.planned = planned
        if planned or time.monotonic() >= deadline or should_stop():
            return outcome


def _plan_page(
    sessions: sessionmaker[Session], period: Period, page_size: int, send_jobs: SendJobs, outcome: SliceOutcome
) -> bool | None:
    """Record and send one page and advance the cursor; returns whether the walk is done, or
    ``None`` when the period is cancelled."""
    with sessions.begin() as session:
        run = session.scalars(
            select(PeriodRun).where(PeriodRun.period == str(period)).with_for_update()
        ).one_or_none()
        if run is None:
            raise UnknownRun(f"Period {period} was never triggered.")
        if run.state == RunState.CANCELLED:
            return None
        outcome.cursor = run.cursor
        if run.planned:
            return True
        page = select(User.id).where(User.active, User.id > run.cursor).order_by(User.id).limit(page_size)
        last = session.scalar(select(func.max(page.subquery().c.id)))
        now = utcnow()
        if last is None:
            # The walk is over: sweep up any item never sent (an earlier release recorded and sent
            # a page in two transactions, and could stop between them). Once per period.
            claimed = session.scalars(
                update(ReportItem)
                .where(ReportItem.period == str(period), ReportItem.enqueued_at.is_(None))
                .values(enqueued_at=now)
                .returning(ReportItem.user_id)
            ).all()
        else:
            # Recorded and stamped in the database itself; an item already there is claimed
            # only if it was never sent.
            recorded = dialect_insert(session, ReportItem.__table__).from_select(
                ["period", "user_id", "state", "attempts", "enqueued_at", "created_at", "updated_at"],
                select(literal(str(period)), User.id, literal(ItemState.PENDING.value), literal(0),
                       *[literal(now, DateTime())] * 3)
                .where(User.active, User.id > run.cursor, User.id <= last),
            )
            claimed = session.scalars(
                recorded.on_conflict_do_update(
                    index_elements=["period", "user_id"], set_={"enqueued_at": now},
                    where=ReportItem.__table__.c.enqueued_at.is_(None),
                ).returning(ReportItem.__table__.c.user_id)
            ).all()
        outcome.enqueued += send_jobs(
            ReportJob(period, user_id, run.template_version).payload() for user_id in sorted(claimed)
        )
        outcome.pages += 1
        run.updated_at = now
        if last is not None:
            run.cursor = outcome.cursor = last
            return False
        run.planned, run.planned_at = True, now
        return True
