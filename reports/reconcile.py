"""Reconcile a period by counting: what should exist against what does, and re-send what is stuck.

It is the guarantee for when the broker itself loses messages (Redis flushed, failed over
without persistence): items stay ``pending`` with nothing in flight, and only counting finds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from reports import progress
from reports.jobs import PlanJob, ReportJob
from reports.models import Delivery, DeliveryState, ItemState, PeriodRun, ReportItem, User
from reports.periods import Period

#: Stuck items re-enqueued per transaction.
CHUNK = 1000

SendJobs = Callable[[Iterable[dict[str, Any]]], int]
SendCoordinator = Callable[[dict[str, Any]], None]


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
    #: Pending items re-enqueued: untouched for longer than the threshold, and not claimed by a
    #: live sender.
    requeued: int
    coordinator_enqueued: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reconcile(
    sessions: sessionmaker[Session],
    period: Period,
    send_jobs: SendJobs,
    send_coordinator: SendCoordinator,
    *,
    stuck_after: timedelta,
    now: datetime,
) -> Reconciliation:
    """Count the period and re-enqueue its stuck items (and its coordinator, if the walk is unfinished).

    Re-enqueuing stamps each item, so running it again at once re-sends nothing; a copy that
    races a message still somewhere in flight is absorbed by the delivery claim.
    """
    untouched_since = now - stuck_after  # first: an impossible threshold fails before anything is sent
    with sessions.begin() as session:
        counts = progress.count(session, period)  # BadInput for a period never triggered
        run = session.get(PeriodRun, str(period))
        assert run is not None
        template_version = run.template_version
        active = session.scalar(select(func.count()).select_from(User).where(User.active)) or 0
        without_item = session.scalar(
            select(func.count()).select_from(User).where(
                User.active,
                ~exists().where(ReportItem.period == str(period), ReportItem.user_id == User.id),
            )
        ) or 0
        # A walk that has made no progress for the threshold lost its coordinator; one that is
        # moving has a coordinator in flight and needs no second one.
        coordinator_enqueued = not counts.planned and run.updated_at < untouched_since
        if coordinator_enqueued:
            run.updated_at = now
            send_coordinator(PlanJob(period).payload())

    requeued = after = 0
    while True:
        with sessions.begin() as session:
            user_ids = session.scalars(
                update(ReportItem)
                .where(*_stuck(period, untouched_since, now), ReportItem.user_id.in_(
                    select(ReportItem.user_id)
                    .where(*_stuck(period, untouched_since, now), ReportItem.user_id > after)
                    .order_by(ReportItem.user_id)
                    .limit(CHUNK)
                    .scalar_subquery()
                ))
                .values(updated_at=now, enqueued_at=now)
                .returning(ReportItem.user_id)
                .execution_options(synchronize_session=False)
            ).all()
            if not user_ids:
                break
            requeued += send_jobs(
                ReportJob(period, user_id, template_version).payload() for user_id in sorted(user_ids)
            )
            after = max(user_ids)

    return Reconciliation(
        period=str(period), planned=counts.planned, active_users=active, items=counts.total,
        active_without_item=without_item, finished=counts.finished, pending=counts.pending,
        requeued=requeued, coordinator_enqueued=coordinator_enqueued,
    )


def _stuck(period: Period, untouched_since: datetime, now: datetime) -> list[Any]:
    live_claim = exists().where(
        Delivery.period == ReportItem.period,
        Delivery.user_id == ReportItem.user_id,
        and_(Delivery.state == DeliveryState.CLAIMED, Delivery.lease_expires_at > now),
    )
    return [
        ReportItem.period == str(period),
        ReportItem.state == ItemState.PENDING,
        ReportItem.updated_at < untouched_since,
        ~live_claim,
    ]
