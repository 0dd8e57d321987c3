"""Period runs: created once per period by a trigger, and read by everything that reports on one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import dramatiq
from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session, sessionmaker

from reports.broker import send, send_many
from reports.errors import BadInput
from reports.jobs import BUILD_REPORT, PLAN_PERIOD, PlanJob
from reports.models import ItemState, PeriodRun, ReportItem, RunState
from reports.periods import Period
from reports.reconcile import reconcile
from reports.sql import insert_ignoring_conflicts


@dataclass(frozen=True)
class Triggered:
    run: PeriodRun
    #: False when the period had been triggered before.
    created: bool
    #: True when the period had been cancelled and this trigger made it active again.
    resumed: bool = False

    @property
    def needs_coordinator(self) -> bool:
        return not self.run.planned


def trigger(session: Session, period: Period, *, template_version: str, now: datetime) -> Triggered:
    """Create the period's run if it has none; the template version is pinned by the first trigger."""
    # RETURNING, not rowcount: drivers disagree on rowcount for ON CONFLICT DO NOTHING.
    inserted = session.execute(
        insert_ignoring_conflicts(session, PeriodRun.__table__)
        .values(
            period=str(period), state=RunState.ACTIVE, template_version=template_version, cursor=0,
            planned=False, triggered_at=now, updated_at=now,
        )
        .returning(PeriodRun.__table__.c.period)
    ).first()
    run = session.get(PeriodRun, str(period), populate_existing=True, with_for_update=True)
    assert run is not None
    resumed = run.state == RunState.CANCELLED
    if resumed:
        run.state, run.updated_at = RunState.ACTIVE, now
    return Triggered(run=run, created=inserted is not None, resumed=resumed)


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
    sessions: sessionmaker[Session], broker: dramatiq.Broker, period: Period, *, template_version: str, now: datetime
) -> Triggered:
    """Trigger ``period`` and enqueue its coordinator unless it has walked every user already.

    The run is committed before the coordinator is enqueued: if the enqueue fails, triggering
    again is safe and enqueues it then. A cancelled period is resumed.
    """
    with sessions.begin() as session:
        triggered = trigger(session, period, template_version=template_version, now=now)
    if triggered.resumed:
        # Messages consumed while cancelled left their items pending: send every pending item
        # not claimed by a live sender, and the coordinator if the walk is unfinished.
        reconcile(
            sessions, period,
            send_jobs=lambda payloads: send_many(broker, BUILD_REPORT, payloads),
            send_coordinator=lambda payload: send(broker, PLAN_PERIOD, payload),
            stuck_after=timedelta(0), now=now,
        )
    elif triggered.needs_coordinator:
        send(broker, PLAN_PERIOD, PlanJob(period).payload())
    return triggered


def unfinished(session: Session) -> list[Period]:
    """Active runs whose walk is unfinished or that still have a pending item, oldest first."""
    pending = exists().where(ReportItem.period == PeriodRun.period, ReportItem.state == ItemState.PENDING)
    rows = session.scalars(
        select(PeriodRun.period)
        .where(PeriodRun.state == RunState.ACTIVE, or_(PeriodRun.planned.is_(False), pending))
        .order_by(PeriodRun.period)
    ).all()
    return [Period.parse(row) for row in rows]
