"""Period runs: created once per period by a trigger, and read by everything that reports on one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from sqlalchemy import Exists, exists, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from reports import partitions
from reports.delivery.breaker import Reader, mail_breaker_name
from reports.errors import BadInput
from reports.fanout import progress
from reports.fanout.reconcile import Reconciliation, reconcile, reconcile_requests
from reports.jobs import SEND_NOW, CoordinatorJob
from reports.local_time import SendSchedule
from reports.models import DeliveryState, ItemState, PeriodRun, ReportItem, RunState, SendNowRequest
from reports.periods import Period
from reports.queue import Queue
from reports.sql import insert_ignoring_conflicts


@dataclass(frozen=True)
class Triggered:
    run: PeriodRun
    #: False when the period had been triggered before.
    created: bool
    #: True when the period had been cancelled and this trigger made it active again.
    resumed: bool = False
    #: The period's counts when the trigger found its walk over and so did nothing.
    counts: progress.Progress | None = None
    #: The walk is over and reports wait for their due time: the coordinator chain releases them.
    releasing: bool = False

    @property
    def needs_coordinator(self) -> bool:
        return not self.run.planned or self.releasing

    def describe(self) -> str:
        """What the trigger did, as one line for the operator."""
        run = self.run
        if self.resumed:
            return (
                f"{run.period} resumed: pending reports re-enqueued"
                + ("" if not self.needs_coordinator else ", and the coordinator")
                + "."
            )
        if self.created:
            schedule = run.schedule
            due = "" if schedule is None else f"; each report due at {schedule.at_text} on its user's clock"
            return f"Triggered {run.period}: coordinator enqueued (template {run.template_version}{due})."
        if self.releasing:
            return f"{run.period} was already walked; coordinator enqueued to release the reports not yet due as they come due."
        if self.needs_coordinator:
            where = "from the first user" if run.cursor is None else f"after user {run.cursor}"
            return f"{run.period} was already triggered; coordinator enqueued to resume {where}."
        if self.counts is not None and self.counts.complete:
            counts = self.counts
            return (
                f"{run.period} is already complete ({counts.delivered:,} delivered, {counts.skipped:,} skipped, "
                f"{counts.dead:,} dead); nothing enqueued, nothing sent."
            )
        return f"{run.period} is already planned; nothing enqueued."


def trigger(
    session: Session,
    period: Period,
    *,
    template_version: str,
    now: datetime,
    schedule: SendSchedule | None = None,
    restart_walk: bool = False,
    resume: bool = True,
) -> Triggered:
    """Create the period's run if it has none; the template version and the send ``schedule`` are
    pinned by the first trigger.

    A new run names its coordinator chain (``walker``), which the caller then enqueues. With
    ``restart_walk``, an existing unfinished walk (or a release of reports not yet due) is given a
    new chain too, for the caller to enqueue: whichever chain was out there stops at its next slice. Without it, a run that
    exists keeps its chain (another scheduler replica created it and enqueued its coordinator).
    A cancelled run is made active again, unless ``resume`` is false: only an operator resumes a
    month, never the scheduler that found it missing a moment before the operator made and cancelled it.
    """
    # RETURNING, not rowcount: drivers disagree on rowcount for ON CONFLICT DO NOTHING.
    inserted = session.execute(
        insert_ignoring_conflicts(session, PeriodRun.__table__)
        .values(
            period=str(period),
            state=RunState.ACTIVE,
            template_version=template_version,
            cursor=None,
            planned=False,
            triggered_at=now,
            updated_at=now,
            send_at=None if schedule is None else schedule.at_text,
            default_time_zone=None if schedule is None else schedule.default_zone,
        )
        .returning(PeriodRun.__table__.c.period)
    ).first()
    run = session.get(PeriodRun, str(period), populate_existing=True, with_for_update=True)
    assert run is not None
    if not run.planned:
        # Before the coordinator records the period's first items.
        partitions.ensure(session, period)
    resumed = resume and run.state == RunState.CANCELLED
    releasing = run.planned and progress.waiting(session, period)
    if resumed:
        run.state, run.updated_at = RunState.ACTIVE, now
    elif (not run.planned or releasing) and (inserted is not None or restart_walk):
        run.walker = str(uuid.uuid4())
    done = inserted is None and not resumed and run.planned and not releasing
    counts = progress.count(session, period) if done else None
    return Triggered(run=run, created=inserted is not None, resumed=resumed, counts=counts, releasing=releasing)


def cancel(session: Session, period: Period, *, now: datetime) -> bool:
    """Stop a period: no new sends, what is in flight finishes. ``False`` if it was already cancelled."""
    run = session.get(PeriodRun, str(period), with_for_update=True)
    if run is None:
        raise BadInput(f"Period {period} has never been triggered.")
    if run.state == RunState.CANCELLED:
        return False
    run.state, run.updated_at = RunState.CANCELLED, now
    return True


def trigger_and_enqueue(
    sessions: sessionmaker[Session],
    queue: Queue,
    period: Period,
    *,
    template_version: str,
    now: datetime,
    schedule: SendSchedule | None = None,
) -> Triggered:
    """Trigger ``period`` and enqueue its coordinator unless it has walked every user already.

    The run is committed before the coordinator is enqueued: if the enqueue fails, triggering
    again is safe and enqueues it then. A cancelled period is resumed.
    """
    with sessions.begin() as session:
        triggered = trigger(
            session, period, template_version=template_version, now=now, schedule=schedule, restart_walk=True
        )
    if triggered.resumed:
        # Messages consumed while cancelled left their items pending: send every pending item
        # not claimed by a live sender, and the coordinator if the walk is unfinished.
        try:
            reconcile(sessions, period, queue, stuck_after=timedelta(0), now=now, resume=True)
        except Exception:
            # Cancelled again, so that triggering again resumes it again: an active month's
            # trigger has nothing to resume, and its lost items would wait for reconcile.
            with sessions.begin() as session:
                _undo_resume(session, period, resumed_at=now)
            raise
    elif triggered.needs_coordinator:
        assert triggered.run.walker is not None
        queue.send_coordinator(triggered.run.walker, CoordinatorJob(period).payload())
    return triggered


def _undo_resume(session: Session, period: Period, *, resumed_at: datetime) -> None:
    """Cancel ``period`` again, unless something since has changed its run: another operator's
    cancel and resume, which stands."""
    run = session.get(PeriodRun, str(period), with_for_update=True)
    if run is not None and run.state == RunState.ACTIVE and run.updated_at == resumed_at:
        run.state = RunState.CANCELLED


def unfinished(session: Session) -> list[Period]:
    """Active runs whose walk is unfinished, or that still have a pending item or an unfinished
    send-now request, oldest first."""
    pending = exists().where(ReportItem.period == PeriodRun.period, ReportItem.state == ItemState.PENDING)
    rows = session.scalars(
        select(PeriodRun.period)
        .where(
            PeriodRun.state == RunState.ACTIVE,
            or_(PeriodRun.planned.is_(False), pending, _unfinished_request(PeriodRun.period)),
        )
        .order_by(PeriodRun.period)
    ).all()
    return [Period.parse(row) for row in rows]


def finished(session: Session, period: str, *, lock: bool = False) -> bool:
    """Whether ``period``'s run is done: walked, no item pending, no send-now request unfinished.

    A period never triggered is not: a send-now of it took the monthly claim, and that delivery
    is what keeps a later trigger from mailing the user a second time. Pending items are read
    from the kept counts, so the check costs the same at a million items as at ten.

    :param lock: lock the run first, until the transaction ends, as a prune batch does: this waits
        for every :func:`reports.pruning.hold_off` of the period, and they wait for it.
    """
    planned = select(PeriodRun.planned).where(PeriodRun.period == period)
    if not session.scalar(planned.with_for_update() if lock else planned):
        return False
    return not session.scalar(select(or_(progress.pending(period) > 0, _unfinished_request(period))))


def _unfinished_request(period: InstrumentedAttribute[str] | str) -> Exists:
    return exists().where(
        SendNowRequest.period == period, SendNowRequest.state.in_((DeliveryState.REQUESTED, DeliveryState.CLAIMED))
    )


def reconcile_through(
    sessions: sessionmaker[Session],
    queue: Queue,
    period: Period,
    *,
    redis_client: redis.Redis,
    namespace: str,
    stuck_after: timedelta,
    now: datetime,
) -> Reconciliation:
    """Reconcile ``period`` against the live broker: its queues and the mail breaker tell what may
    still be on its way (see :mod:`reports.fanout.reconcile`)."""
    return reconcile(
        sessions,
        period,
        queue,
        breaker=Reader(redis_client, mail_breaker_name(namespace)),
        requests=True,
        stuck_after=stuck_after,
        now=now,
    )


def reconcile_every_request(
    sessions: sessionmaker[Session],
    queue: Queue,
    *,
    redis_client: redis.Redis,
    namespace: str,
    stuck_after: timedelta,
    now: datetime,
) -> int:
    """Re-enqueue lost send-now requests of every period (one never triggered too); returns how many."""
    if Reader(redis_client, mail_breaker_name(namespace)).holds_back() or queue.backlog(SEND_NOW.queue) > 0:
        return 0
    return reconcile_requests(
        sessions,
        queue,
        period=None,
        untouched_since=now - stuck_after,
        now=now,
    )
