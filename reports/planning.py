"""The coordinator: walk a period's active users in keyset pages and enqueue one job per user.

Each page is two short transactions. The first records the page's items (one per user, under
the unique (period, user) key). The second takes the run's row lock, hands every item in the
page's id range that has no ``enqueued_at`` to the broker, stamps it, and advances the cursor.
A crash between the two leaves items recorded but not enqueued, below no checkpoint: the next
run walks the same page and sends them. A crash after sending but before the commit re-sends
on the next run, which the consumer's delivery claim absorbs. Two coordinators at once
serialize on the row lock, and the second finds the cursor moved and continues from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.errors import PermanentError
from reports.jobs import ReportJob
from reports.models import ItemState, PeriodRun, ReportItem, RunState, User
from reports.periods import Period
from reports.sql import insert_ignoring_conflicts

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
        cursor, planned, page = _record_page(sessions, period, page_size)
        if cursor is None:
            outcome.cancelled = True
            return outcome
        if not planned:
            planned = _enqueue_page(sessions, period, cursor, page, send_jobs, outcome)
        outcome.planned = planned
        if planned or time.monotonic() >= deadline or should_stop():
            return outcome


def _record_page(
    sessions: sessionmaker[Session], period: Period, page_size: int
) -> tuple[int | None, bool, list[int]]:
    """Record one page of items; the cursor is ``None`` when the period is cancelled."""
    with sessions.begin() as session:
        run = session.get(PeriodRun, str(period))
        if run is None:
            raise UnknownRun(f"Period {period} was never triggered.")
        if run.state == RunState.CANCELLED:
            return None, False, []
        if run.planned:
            return run.cursor, True, []
        user_ids = list(
            session.scalars(
                select(User.id).where(User.active, User.id > run.cursor).order_by(User.id).limit(page_size)
            )
        )
        if user_ids:
            now = utcnow()
            session.execute(
                insert_ignoring_conflicts(session, ReportItem.__table__),
                [
                    {"period": str(period), "user_id": user_id, "state": ItemState.PENDING, "attempts": 0,
                     "created_at": now, "updated_at": now}
                    for user_id in user_ids
                ],
            )
        return run.cursor, False, user_ids


def _enqueue_page(
    sessions: sessionmaker[Session],
    period: Period,
    cursor: int,
    page: list[int],
    send_jobs: SendJobs,
    outcome: SliceOutcome,
) -> bool:
    """Send the page's unsent items and advance the cursor; returns whether the walk is done."""
    with sessions.begin() as session:
        run = session.scalars(
            select(PeriodRun).where(PeriodRun.period == str(period)).with_for_update()
        ).one()
        if run.planned or run.cursor != cursor or run.state == RunState.CANCELLED:
            # Another coordinator moved on while this one recorded the page (follow it), or the
            # period was cancelled meanwhile (the next page read says so).
            return run.planned
        now = utcnow()
        in_range = [ReportItem.period == str(period), ReportItem.user_id > cursor, ReportItem.enqueued_at.is_(None)]
        if page:
            in_range.append(ReportItem.user_id <= page[-1])
        claimed = session.scalars(
            update(ReportItem).where(*in_range).values(enqueued_at=now).returning(ReportItem.user_id)
        ).all()
        outcome.enqueued += send_jobs(
            ReportJob(period, user_id, run.template_version).payload() for user_id in sorted(claimed)
        )
        outcome.pages += 1
        run.updated_at = now
        if page:
            run.cursor = outcome.cursor = page[-1]
            return False
        run.planned, run.planned_at = True, now
        outcome.cursor = run.cursor
        return True
