"""Period runs: created once per period by a trigger, and read by everything that reports on one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import dramatiq
from sqlalchemy.orm import Session, sessionmaker

from reports.broker import send
from reports.jobs import PLAN_PERIOD, PlanJob
from reports.models import PeriodRun, RunState
from reports.periods import Period
from reports.sql import insert_ignoring_conflicts


@dataclass(frozen=True)
class Triggered:
    run: PeriodRun
    #: False when the period had been triggered before (the call changed nothing).
    created: bool

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
    run = session.get(PeriodRun, str(period), populate_existing=True)
    assert run is not None
    return Triggered(run=run, created=inserted is not None)


def trigger_and_enqueue(
    sessions: sessionmaker[Session], broker: dramatiq.Broker, period: Period, *, template_version: str, now: datetime
) -> Triggered:
    """Trigger ``period`` and enqueue its coordinator unless it has walked every user already.

    The run is committed before the coordinator is enqueued: if the enqueue fails, triggering
    again is safe and enqueues it then.
    """
    with sessions.begin() as session:
        triggered = trigger(session, period, template_version=template_version, now=now)
    if triggered.needs_coordinator:
        send(broker, PLAN_PERIOD, PlanJob(period).payload())
    return triggered
