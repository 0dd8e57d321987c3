"""Reconcile a period by counting: what should exist against what does, and re-send what is lost.

Lost is told from waiting by facts, not by age alone (docs/explanation/guarantees.md, "Reconcile").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from reports.delivery.breaker import Reader
from reports.fanout import progress
from reports.jobs import BUILD_REPORT, SEND_NOW, CoordinatorJob, ReportJob, SendNowJob
from reports.models import (
    LOOK_AGAIN,
    Delivery,
    DeliveryState,
    ItemState,
    PeriodRun,
    ReportItem,
    RunState,
    SendNowRequest,
    Suppression,
    User,
)
from reports.periods import Period
from reports.queue import Queue
from reports.sql import after, server_now

#: Stuck items re-enqueued per transaction.
CHUNK = 1000


@dataclass(frozen=True)
class Reconciliation:
    period: str
    planned: bool
    active_users: int
    items: int
    #: Active users with no item: activated or created after the walk passed their id.
    active_without_item: int
    finished: int
    pending: int
    #: Pending items re-enqueued: never handed out, or handed out and lost (see the module).
    requeued: int
    #: Pending items left alone because a message for them may still be on its way.
    waiting: int
    coordinator_enqueued: bool
    #: The walk is paused on the bulk queue's high-water mark (and alive).
    walk_paused: bool
    #: send-now requests of the period re-enqueued: never finished, and their message lost.
    requests_requeued: int = 0
    #: Pending items not yet due: they wait for their users' mornings, and are not lost.
    scheduled: int = 0
    #: The period is cancelled: its items are not re-enqueued (nor its walk) until it is resumed.
    cancelled: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reconcile(
    sessions: sessionmaker[Session],
    period: Period,
    queue: Queue,
    *,
    stuck_after: timedelta,
    now: datetime,
    breaker: Reader | None = None,
    requests: bool = False,
    resume: bool = False,
) -> Reconciliation:
    """Count the period and re-enqueue what is lost (and its coordinator, if the walk is lost).

    ``queue``'s backlog and the mail ``breaker`` (``None``: none, as closed) tell what may still
    be on its way; ``requests`` reconciles the period's send-now requests too.

    ``resume`` is for a cancelled period made active again: messages consumed while it was
    cancelled left their items pending, so every pending item is sent, and the coordinator if
    the walk is unfinished, whatever the queue holds. An item whose claim is still live is sent
    too: its lease may be one an unconfirmed send kept, whose retry was consumed while the month
    was cancelled, and nothing else would look at it again until it counted as stuck; its message
    waits the lease out (a claim held by another copy defers it). Re-enqueuing stamps each item,
    so running it again at once re-sends nothing; a copy that races a message still in flight is
    absorbed by the delivery claim.
    """
    untouched_since = now - stuck_after  # first: an impossible threshold fails before anything is sent
    holds_back = breaker.holds_back if breaker is not None else _never
    with sessions.begin() as session:
        counts = progress.count(session, period)  # BadInput for a period never triggered
        # Before the run's lock, which the walk needs for each page: these two read every active
        # user (about a second at a million), and only what they say depends on them.
        active = session.scalar(select(func.count()).select_from(User).where(User.active)) or 0
        without_item = (
            session.scalar(
                select(func.count())
                .select_from(User)
                .where(
                    User.active,
                    ~exists().where(ReportItem.period == str(period), ReportItem.user_id == User.id),
                    # Not planned on purpose: the coordinator leaves suppressed users out.
                    ~exists().where(Suppression.user_id == User.id),
                )
            )
            or 0
        )
        leases_live_at = session.execute(select(server_now())).scalar_one()
        run = session.get(PeriodRun, str(period), with_for_update=True)
        assert run is not None
        template_version = run.template_version
        walk_paused = not counts.planned and run.paused_at is not None and run.paused_at >= untouched_since
        scheduled = progress.scheduled(session, period, now)
        # The chain walks, then releases what waits for its due time: either left to do needs it.
        chain_needed = not counts.planned or progress.waiting(session, period)
        # A cancelled month sends nothing until `reports trigger` resumes it (``resume``): its
        # chain and its messages would only find it cancelled.
        cancelled = run.state == RunState.CANCELLED and not resume
        coordinator_enqueued = chain_needed and not cancelled and (resume or run.updated_at < untouched_since)
        if coordinator_enqueued:
            queue.send_coordinator(run.new_chain(now), CoordinatorJob(period).payload())

    may_be_waiting = not resume and (holds_back() or queue.backlog(BUILD_REPORT.queue) > 0)
    lost = _lost(
        period,
        untouched_since,
        now,
        leases_live_at=leases_live_at,
        handed_out_too=not may_be_waiting,
        claimed_too=resume,
    )
    requeued = 0
    if not cancelled:
        requeued = _requeue(
            sessions,
            period,
            lost,
            now,
            lambda user_ids: queue.send_jobs(
                BUILD_REPORT, (ReportJob(period, user_id, template_version).payload() for user_id in user_ids)
            ),
        )
    waiting = 0
    if may_be_waiting:
        with sessions.begin() as session:
            waiting = (
                session.scalar(
                    select(func.count())
                    .select_from(ReportItem)
                    .where(*_lost(period, untouched_since, now, leases_live_at=leases_live_at, handed_out_too=True))
                )
                or 0
            )

    requests_requeued = 0
    if requests and not holds_back() and queue.backlog(SEND_NOW.queue) == 0:
        requests_requeued = reconcile_requests(sessions, queue, period=period, untouched_since=untouched_since, now=now)
    return Reconciliation(
        period=str(period),
        planned=counts.planned,
        active_users=active,
        items=counts.total,
        active_without_item=without_item,
        finished=counts.finished,
        pending=counts.pending,
        requeued=requeued,
        waiting=waiting,
        coordinator_enqueued=coordinator_enqueued,
        walk_paused=walk_paused,
        requests_requeued=requests_requeued,
        scheduled=scheduled,
        cancelled=cancelled,
    )


def _requeue(
    sessions: sessionmaker[Session],
    period: Period,
    where: list[Any],
    now: datetime,
    send: Callable[[list[int]], int],
) -> int:
    """Stamp and send the items matching ``where``, a chunk per transaction, each once. An item that
    waited for its due time is released by this as by the chain, which then passes it by."""
    requeued, last = 0, None
    while True:
        with sessions.begin() as session:
            user_ids = session.scalars(
                update(ReportItem)
                .where(
                    *where,
                    ReportItem.user_id.in_(
                        select(ReportItem.user_id)
                        .where(*where, after(ReportItem.user_id, last))
                        .order_by(ReportItem.user_id)
                        .limit(CHUNK)
                        .scalar_subquery()
                    ),
                )
                .values(updated_at=now, enqueued_at=now, due_at=None)
                .returning(ReportItem.user_id)
                .execution_options(synchronize_session=False)
            ).all()
            if not user_ids:
                return requeued
            requeued += send(sorted(user_ids))
            last = max(user_ids)


def _lost(
    period: Period,
    untouched_since: datetime,
    now: datetime,
    *,
    leases_live_at: datetime,
    handed_out_too: bool,
    claimed_too: bool = False,
) -> list[Any]:
    live_claim = exists().where(
        Delivery.period == str(period),
        Delivery.user_id == ReportItem.user_id,
        # The database's clock, the one the lease was written on, read once and bound: PostgreSQL
        # ran the check once per pending item against clock_timestamp(), which changes as it runs,
        # and joins once against a value. A lease that ends meanwhile is looked at next time.
        and_(Delivery.state == DeliveryState.CLAIMED, Delivery.lease_expires_at > leases_live_at),
    )
    return [
        ReportItem.period == str(period),
        ReportItem.state == ItemState.PENDING,
        ReportItem.updated_at < untouched_since,
        # One not yet due waits for its user's morning, and one whose user changed zone for the
        # chain to work out their new morning (LOOK_AGAIN, in the past only to be looked at
        # first); one due and never released is lost.
        or_(ReportItem.due_at.is_(None), and_(ReportItem.due_at <= now, ReportItem.due_at != LOOK_AGAIN)),
        *([] if claimed_too else [~live_claim]),
        *([] if handed_out_too else [ReportItem.enqueued_at.is_(None)]),
    ]


def _never() -> bool:
    return False


def reconcile_requests(
    sessions: sessionmaker[Session],
    queue: Queue,
    *,
    period: Period | None,
    untouched_since: datetime,
    now: datetime,
) -> int:
    """Re-enqueue send-now requests (of ``period``, or all) that never finished and were lost.

    A request is written when it is made; one neither sent nor dead, with no live lease and
    untouched past the threshold, has no message left. Stamped, so running again re-sends nothing.
    """
    with sessions.begin() as session:
        requests = session.execute(
            update(SendNowRequest)
            .where(
                *([SendNowRequest.period == str(period)] if period is not None else []),
                SendNowRequest.state.in_((DeliveryState.REQUESTED, DeliveryState.CLAIMED)),
                SendNowRequest.lease_expires_at <= server_now(),
                or_(SendNowRequest.updated_at.is_(None), SendNowRequest.updated_at < untouched_since),
                SendNowRequest.template_version.is_not(None),
            )
            .values(updated_at=now)
            .returning(
                SendNowRequest.period,
                SendNowRequest.user_id,
                SendNowRequest.request_id,
                SendNowRequest.template_version,
            )
            .execution_options(synchronize_session=False)
        ).all()
        payloads = [
            SendNowJob(Period.parse(row_period), user_id, request_id, str(version)).payload()
            for row_period, user_id, request_id, version in sorted(requests)
        ]
        return queue.send_jobs(SEND_NOW, payloads) if payloads else 0
