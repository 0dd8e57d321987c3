"""The coordinator: walk a period's active users in keyset pages and enqueue one job per user,
then, when the run sends in each user's morning, release the items as they come due.

A page is recorded (items and cursor, under the run's row lock), then handed to the broker, then
stamped ``enqueued_at``; what a crash between the steps leaves and who sends it:
docs/explanation/guarantees.md, "Items before messages". A released page is stamped first, in the
transaction that finds it due, then handed out: "Released in the user's morning".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, ColumnExpressionArgument, DateTime, case, exists, func, literal, select, update
from sqlalchemy.orm import Session, sessionmaker

from reports import items, partitions
from reports.clock import utcnow
from reports.counters import FALLBACKS
from reports.errors import PermanentError
from reports.jobs import BUILD_REPORT, ReportJob
from reports.local_time import SendSchedule
from reports.models import ItemState, PeriodRun, ReportItem, RunState, Suppression, User
from reports.periods import Period
from reports.queue import Queue
from reports.sql import after, insert_on_conflict

#: An item recorded this long ago and still not handed out was left by a crash, not by a copy
#: of the coordinator that is handing its page out right now: a page takes a round trip to Redis,
#: about a second of RabbitMQ's confirms, or a few seconds of SQS's batches of ten. Too short only
#: costs a second message for the copy still sending, which the consumer's claim turns away; too
#: long is how late a killed coordinator's page goes out.
HANDOFF_GRACE = timedelta(seconds=15)

#: Longest the chain waits between two looks for items come due, in seconds: a user whose time
#: zone changed to one further east is released within this of their new due time.
RELEASE_LOOK_SECONDS = 60.0


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
    #: Every user is recorded and items wait for their due time: the chain looks again in this many
    #: seconds. ``None``: no item waits.
    release_in: float | None = None

    def continue_in(self, *, pause_seconds: float) -> float | None:
        """When the chain's next slice is to run, in seconds from now; ``None``: the chain ends.

        Short slices keep the coordinator drainable on SIGTERM, and the checkpoint carries the walk
        on. A full bulk queue, or a crashed page not yet old enough to hand out, is looked at again
        after ``pause_seconds``. Reports waiting for their users' mornings are looked at when the
        next is due, at most ``RELEASE_LOOK_SECONDS`` on: never as a message held for hours.
        """
        if self.cancelled or self.superseded:
            return None
        if self.backlogged or self.settling:
            return pause_seconds
        if self.release_in is not None:
            return self.release_in
        return None if self.planned else 0.0


@dataclass(frozen=True)
class _Page:
    """Items recorded (or found never handed out) in one transaction, to hand out after its commit."""

    user_ids: list[int]
    template_version: str
    #: Whether this was the walk's last page.
    planned: bool
    #: Whether the walk is over but waits for items too recently recorded to hand out yet.
    settling: bool = False
    #: Whether the items are stamped as handed out already (a release stamps before it sends).
    stamped: bool = False
    #: The earliest due time of an item still waiting after this page, once every user is recorded.
    next_due: datetime | None = None


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
    clock: Callable[[], datetime] = utcnow,
) -> SliceOutcome:
    """Walk pages until the period is planned, ``budget_seconds`` have passed or ``should_stop()``,
    or the bulk queue's backlog (messages not yet done) reaches ``high_water`` (``None``: never);
    once it is planned, release the items whose due time has come by ``clock``.

    ``walker`` is the chain's token; a chain the run does not name stops (``None``: a caller that
    walks in-process, outside any chain, such as a benchmark). The caller re-enqueues
    the coordinator (with the same token) when the outcome is neither ``planned``, ``cancelled``
    nor ``superseded``, with a delay when it is ``backlogged``, and after ``release_in`` seconds
    when that is set.
    """
    deadline = time.monotonic() + budget_seconds
    outcome = SliceOutcome()
    while True:
        if high_water is not None and queue.backlog(BUILD_REPORT.queue) >= high_water:
            outcome.backlogged = True
            _note_pause(sessions, period, walker, outcome, clock())
            return outcome
        now = clock()
        page = _record_page(sessions, period, walker, page_size, outcome, now)
        if page is None:
            return outcome
        _hand_out(sessions, period, page, queue, outcome, clock)
        outcome.planned, outcome.settling = page.planned, page.settling
        out_of_time = time.monotonic() >= deadline or should_stop()
        if page.next_due is not None:
            outcome.release_in = min(max((page.next_due - now).total_seconds(), 0.0), RELEASE_LOOK_SECONDS)
            if outcome.release_in > 0 or out_of_time:
                return outcome
            continue
        if page.planned or page.settling or out_of_time:
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


def _note_pause(
    sessions: sessionmaker[Session], period: Period, walker: str | None, outcome: SliceOutcome, now: datetime
) -> None:
    """Record that the walk (or the release after it) is paused, so it reads as alive to reconcile
    rather than idle."""
    with sessions.begin() as session:
        run = _locked_run(session, period, walker, outcome)
        if run is None:
            return
        run.updated_at = now
        if not run.planned:
            run.paused_at = now


def _record_page(
    sessions: sessionmaker[Session],
    period: Period,
    walker: str | None,
    page_size: int,
    outcome: SliceOutcome,
    now: datetime,
) -> _Page | None:
    """Record one page and advance the cursor, or release one once the walk is over; ``None`` when
    the walk is not this chain's to do."""
    with sessions.begin() as session:
        run = _locked_run(session, period, walker, outcome)
        if run is None:
            return None
        if run.planned:
            run.updated_at = now
            return _release_page(session, period, run, page_size, now)
        if run.cursor is None:
            # Triggered by a release that made no partitions (during a deploy that brings them).
            partitions.ensure(session, period)
        page = select(User.id).where(User.active, after(User.id, run.cursor)).order_by(User.id).limit(page_size)
        last = session.scalar(select(func.max(page.subquery().c.id)))
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
            return _Page(ready, run.template_version, planned=True, next_due=_next_due(session, period))
        in_page = (
            User.active,
            after(User.id, run.cursor),
            User.id <= last,
            # Suppressed users get no item: inside this statement, so no statement is added.
            ~exists().where(Suppression.user_id == User.id),
        )
        schedule = run.schedule
        due = literal(None, DateTime()) if schedule is None else _due_times(session, period, schedule, in_page, now)
        recorded = insert_on_conflict(session, ReportItem.__table__).from_select(
            ["period", "user_id", "state", "attempts", "created_at", "updated_at", "due_at"],
            select(
                literal(str(period)),
                User.id,
                literal(ItemState.PENDING.value),
                literal(0),
                *[literal(now, DateTime())] * 2,
                due,
            ).where(*in_page),
        )
        columns = ReportItem.__table__.c
        rows = session.execute(
            # An item already there is handed out again only if it never was.
            recorded.on_conflict_do_update(
                index_elements=["period", "user_id"],
                set_={"updated_at": now},
                where=columns.enqueued_at.is_(None) & (columns.state == ItemState.PENDING),
            ).returning(columns.user_id, columns.due_at)
        ).all()
        run.cursor = outcome.cursor = last
        # An item due later waits for the release.
        return _Page(sorted(user_id for user_id, due_at in rows if due_at is None), run.template_version, planned=False)


def _due_times(
    session: Session,
    period: Period,
    schedule: SendSchedule,
    in_page: tuple[ColumnExpressionArgument[bool], ...],
    now: datetime,
) -> ColumnElement[datetime]:
    """The page's due times as one SQL expression of each user's zone, NULL for one due already.

    The zones come from the page itself (one grouped read of the users being recorded), so the
    expression holds as many cases as the page has zones, and users with an unknown zone are
    counted as fallbacks once each.
    """
    zones = session.execute(select(User.time_zone, func.count()).where(*in_page).group_by(User.time_zone)).all()
    default, _ = schedule.due_at(period, None)
    cases = []
    fallbacks = 0
    for name, users in zones:
        due, fell_back = schedule.due_at(period, name)
        fallbacks += users if fell_back else 0
        if due != default:
            cases.append((User.time_zone == name, _waiting_until(due, now)))
    if fallbacks:
        FALLBACKS.add("time_zone", fallbacks)
    otherwise = _waiting_until(default, now)
    return case(*cases, else_=otherwise) if cases else otherwise


def _waiting_until(due: datetime, now: datetime) -> ColumnElement[datetime]:
    return literal(due if due > now else None, DateTime())


def _release_page(session: Session, period: Period, run: PeriodRun, page_size: int, now: datetime) -> _Page:
    """Stamp a page of the items whose due time has come as handed out, and return it to send.

    Each one's due time is computed again from its user's zone as it is now: a user who moved
    west waits for their new morning, one who moved east (made due at once by the trigger on
    ``users``) is released if theirs has come. Stamped in this transaction, before the send, so
    two releases (a redelivered copy of the chain, reconcile) never hand the same item out; a
    crash before the send leaves it for reconcile, as a lost message.
    """
    waiting = items.waiting(period)
    # The page is taken in due order straight off the index of waiting items, then joined to its
    # users: planned as one join, a large period's estimate led PostgreSQL to a parallel sort.
    page = (
        select(ReportItem.user_id)
        .where(*waiting, ReportItem.due_at <= now)
        .order_by(ReportItem.due_at)
        .limit(page_size)
        .subquery()
    )
    rows = session.execute(select(page.c.user_id, User.time_zone).outerjoin(User, User.id == page.c.user_id)).all()
    schedule = run.schedule
    due_now: list[int] = []
    later: dict[datetime, list[int]] = {}
    for user_id, zone in rows:
        due = now if schedule is None else schedule.due_at(period, zone)[0]
        if due <= now:
            due_now.append(user_id)
        else:
            later.setdefault(due, []).append(user_id)
    for due, user_ids in later.items():
        session.execute(
            update(ReportItem)
            .where(*waiting, ReportItem.user_id.in_(user_ids))
            .values(due_at=due)
            .execution_options(synchronize_session=False)
        )
    released = session.scalars(
        update(ReportItem)
        .where(*waiting, ReportItem.user_id.in_(due_now))
        .values(due_at=None, enqueued_at=now, updated_at=now)
        .returning(ReportItem.user_id)
        .execution_options(synchronize_session=False)
    ).all()
    return _Page(
        sorted(released), run.template_version, planned=True, stamped=True, next_due=_next_due(session, period)
    )


def _next_due(session: Session, period: Period) -> datetime | None:
    """The earliest due time of the period's items still waiting to be released."""
    return session.scalar(select(func.min(ReportItem.due_at)).where(*items.waiting(period)))


def _never_handed_out(session: Session, period: Period) -> list[tuple[int, datetime]]:
    """Pending items with no message out there and none waiting for its due time: each user id and
    when its item was last touched."""
    rows = session.execute(
        select(ReportItem.user_id, ReportItem.updated_at)
        .where(
            ReportItem.period == str(period),
            ReportItem.state == ItemState.PENDING,
            ReportItem.enqueued_at.is_(None),
            ReportItem.due_at.is_(None),
        )
        .order_by(ReportItem.user_id)
    )
    return [(user_id, touched) for user_id, touched in rows]


def _hand_out(
    sessions: sessionmaker[Session],
    period: Period,
    page: _Page,
    queue: Queue,
    outcome: SliceOutcome,
    clock: Callable[[], datetime],
) -> None:
    outcome.pages += 1
    if not page.user_ids:
        return
    outcome.enqueued += queue.send_jobs(
        BUILD_REPORT, (ReportJob(period, user_id, page.template_version).payload() for user_id in page.user_ids)
    )
    if page.stamped:
        return
    with sessions.begin() as session:
        stamp_handed_out(session, period, page.user_ids[0], page.user_ids[-1], now=clock())


def stamp_handed_out(session: Session, period: Period, first: int, last: int, *, now: datetime) -> None:
    """Mark the items from ``first`` to ``last`` as having a message out there: those due now. An
    item of the range waiting for its user's morning got none, and reconcile must not take it for
    one that may still be on its way."""
    session.execute(
        update(ReportItem)
        .where(
            ReportItem.period == str(period),
            ReportItem.user_id.between(first, last),
            ReportItem.enqueued_at.is_(None),
            ReportItem.due_at.is_(None),
        )
        .values(enqueued_at=now)
        .execution_options(synchronize_session=False)
    )
