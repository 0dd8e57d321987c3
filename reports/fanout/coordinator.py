"""The coordinator: walk a period's active users in keyset pages and enqueue one job per user.

A page is recorded (items and cursor, under the run's row lock), then handed to the broker, then
stamped ``enqueued_at``; what a crash between the steps leaves and who sends it:
docs/explanation/guarantees.md, "Items before messages".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import DateTime, exists, func, literal, select, update
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.errors import PermanentError
from reports.jobs import BUILD_REPORT, ReportJob
from reports.models import ItemState, PeriodRun, ReportItem, RunState, Suppression, User
from reports.periods import Period
from reports.queue import Queue
from reports.sql import after, insert_on_conflict

#: An item recorded this long ago and still not handed out was left by a crash, not by a copy
#: of the coordinator that is handing its page out right now.
HANDOFF_GRACE = timedelta(seconds=60)


class UnknownRun(PermanentError):
    """The period has no run: it was never triggered."""


@dataclass
class SliceOutcome:
    pages: int = 0
    enqueued: int = 0
    #: The last user id recorded; ``None`` before the first page.
    cursor: int | None = None
    planned: bool = False
    #: The period was cancelled: the walk stopped, and is not to be continued until resumed.
    cancelled: bool = False
    #: The walk paused because the queue held ``high_water`` messages or more.
    backlogged: bool = False
    #: Another coordinator chain owns the walk now: this one stops without a continuation.
    superseded: bool = False
    #: Every user is recorded, but items recorded less than ``HANDOFF_GRACE`` ago were never
    #: handed out (a coordinator killed between a page's commit and its send, or another copy
    #: handing its page out): the walk looks again after a pause, and ends once none is left.
    settling: bool = False


@dataclass(frozen=True)
class _Page:
    """Items recorded (or found never handed out) in one transaction, to hand out after its commit."""

    user_ids: list[int]
    template_version: str
    #: Whether this was the walk's last page.
    planned: bool
    #: Whether the walk is over but waits for items too recently recorded to hand out yet.
    settling: bool = False


def walk_slice(
    sessions: sessionmaker[Session],
    period: Period,
    queue: Queue,
    *,
    walker: str | None = None,
    page_size: int,
    budget_seconds: float,
    should_stop: Callable[[], bool] = lambda: False,
    high_water: int | None = None,
) -> SliceOutcome:
    """Walk pages until the period is planned, ``budget_seconds`` have passed or ``should_stop()``,
    or the bulk queue's backlog (messages not yet done) reaches ``high_water`` (``None``: never).

    ``walker`` is the chain's token; a chain the run does not name stops (``None``: a caller that
    walks in-process, outside any chain, such as a benchmark). The caller re-enqueues
    the coordinator (with the same token) when the outcome is neither ``planned``, ``cancelled``
    nor ``superseded``, with a delay when it is ``backlogged``.
    """
    deadline = time.monotonic() + budget_seconds
    outcome = SliceOutcome()
    while True:
        if high_water is not None and queue.backlog(BUILD_REPORT.queue) >= high_water:
            outcome.backlogged = True
            _note_pause(sessions, period, walker, outcome)
            return outcome
        page = _record_page(sessions, period, walker, page_size, outcome)
        if page is None:
            return outcome
        _hand_out(sessions, period, page, queue, outcome)
        outcome.planned, outcome.settling = page.planned, page.settling
        if page.planned or page.settling or time.monotonic() >= deadline or should_stop():
            return outcome


def _locked_run(session: Session, period: Period, walker: str | None, outcome: SliceOutcome) -> PeriodRun | None:
    """The run, locked, when this chain may walk it; ``None`` (and the outcome says why) otherwise."""
    run = session.scalars(select(PeriodRun).where(PeriodRun.period == str(period)).with_for_update()).one_or_none()
    if run is None:
        raise UnknownRun(f"Period {period} was never triggered.")
    outcome.cursor = run.cursor
    if run.state == RunState.CANCELLED:
        outcome.cancelled = True
        return None
    if walker is None:
        return run
    if run.walker is None:
        run.walker = walker  # a run triggered by an earlier release: the first chain takes it
    if run.walker != walker:
        outcome.superseded = True
        return None
    return run


def _note_pause(sessions: sessionmaker[Session], period: Period, walker: str | None, outcome: SliceOutcome) -> None:
    """Record that the walk is paused, so it reads as alive to reconcile rather than idle."""
    with sessions.begin() as session:
        run = _locked_run(session, period, walker, outcome)
        if run is not None and not run.planned:
            run.paused_at = run.updated_at = utcnow()


def _record_page(
    sessions: sessionmaker[Session], period: Period, walker: str | None, page_size: int, outcome: SliceOutcome
) -> _Page | None:
    """Record one page and advance the cursor; ``None`` when the walk is not this chain's to do."""
    with sessions.begin() as session:
        run = _locked_run(session, period, walker, outcome)
        if run is None:
            return None
        if run.planned:
            return _Page([], run.template_version, planned=True)
        page = select(User.id).where(User.active, after(User.id, run.cursor)).order_by(User.id).limit(page_size)
        last = session.scalar(select(func.max(page.subquery().c.id)))
        now = utcnow()
        run.updated_at, run.paused_at = now, None
        if last is None:
            # The walk is over: hand out whatever was recorded but never handed out (a crash
            # between a page's commit and its send), once it is old enough not to race the copy
            # that may still be sending it. Reconcile covers a crash after the last hand-out.
            unstamped = _never_handed_out(session, period)
            ready = [user_id for user_id, touched in unstamped if touched < now - HANDOFF_GRACE]
            if len(ready) < len(unstamped):
                run.paused_at = now
                return _Page(ready, run.template_version, planned=False, settling=True)
            run.planned, run.planned_at = True, now
            return _Page(ready, run.template_version, planned=True)
        recorded = insert_on_conflict(session, ReportItem.__table__).from_select(
            ["period", "user_id", "state", "attempts", "created_at", "updated_at"],
            select(
                literal(str(period)),
                User.id,
                literal(ItemState.PENDING.value),
                literal(0),
                *[literal(now, DateTime())] * 2,
            ).where(
                User.active,
                after(User.id, run.cursor),
                User.id <= last,
                # Suppressed users get no item: inside this statement, so no statement is added.
                ~exists().where(Suppression.user_id == User.id),
            ),
        )
        items = ReportItem.__table__.c
        user_ids = session.scalars(
            # An item already there is handed out again only if it never was.
            recorded.on_conflict_do_update(
                index_elements=["period", "user_id"],
                set_={"updated_at": now},
                where=items.enqueued_at.is_(None) & (items.state == ItemState.PENDING),
            ).returning(items.user_id)
        ).all()
        run.cursor = outcome.cursor = last
        return _Page(sorted(user_ids), run.template_version, planned=False)


def _never_handed_out(session: Session, period: Period) -> list[tuple[int, datetime]]:
    """Pending items with no message out there: each user id and when its item was last touched."""
    rows = session.execute(
        select(ReportItem.user_id, ReportItem.updated_at)
        .where(
            ReportItem.period == str(period), ReportItem.state == ItemState.PENDING, ReportItem.enqueued_at.is_(None)
        )
        .order_by(ReportItem.user_id)
    )
    return [(user_id, touched) for user_id, touched in rows]


def _hand_out(
    sessions: sessionmaker[Session], period: Period, page: _Page, queue: Queue, outcome: SliceOutcome
) -> None:
    outcome.pages += 1
    if not page.user_ids:
        return
    outcome.enqueued += queue.send_jobs(
        BUILD_REPORT, (ReportJob(period, user_id, page.template_version).payload() for user_id in page.user_ids)
    )
    with sessions.begin() as session:
        stamp_handed_out(session, period, page.user_ids[0], page.user_ids[-1], now=utcnow())


def stamp_handed_out(session: Session, period: Period, first: int, last: int, *, now: datetime) -> None:
    """Mark the items from ``first`` to ``last`` as having a message out there."""
    session.execute(
        update(ReportItem)
        .where(
            ReportItem.period == str(period), ReportItem.user_id.between(first, last), ReportItem.enqueued_at.is_(None)
        )
        .values(enqueued_at=now)
        .execution_options(synchronize_session=False)
    )
