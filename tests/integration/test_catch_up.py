"""The scheduler's catch-up against a real database: it creates the runs it finds missing, and
never makes active a month an operator cancelled."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import event
from sqlalchemy.orm import Session

from reports.clock import utcnow
from reports.fanout import runs
from reports.models import PeriodRun, RunState
from reports.worker.broker import build_broker, shared_redis
from scheduler.process import SchedulerProcess
from scheduler.schedule import Schedule
from tests.integration.conftest import PERIOD
from tests.support.broker import queued_messages
from tests.support.databases import load_users

#: After the default SCHEDULE_TIME (06:00 UTC) on the 1st: the month before is due.
AFTER_THE_TRIGGER_TIME = datetime(2026, 11, 1, 7, 0)


def test_a_month_an_operator_triggered_and_cancelled_while_the_catch_up_found_it_missing_stays_cancelled(
    sessions, settings
) -> None:
    load_users(sessions, count=5)
    broker = build_broker(settings)
    scheduler = SchedulerProcess(
        settings,
        Schedule.from_settings(settings),
        sessions=sessions,
        broker=broker,
        redis_client=shared_redis(broker, settings),
        clock=lambda: AFTER_THE_TRIGGER_TIME,
    )
    operator_done: list[bool] = []

    def operator_triggers_and_cancels(_session: Session) -> None:
        # Right after the catch-up read which months have no run: `reports trigger`, then `reports cancel`.
        if operator_done:
            return
        operator_done.append(True)
        with sessions.begin() as session:
            runs.trigger(session, PERIOD, template_version=settings.template_version, now=utcnow())
        with sessions.begin() as session:
            assert runs.cancel(session, PERIOD, now=utcnow())

    event.listen(sessions, "after_commit", operator_triggers_and_cancels)
    try:
        triggered = scheduler.catch_up("start")
    finally:
        event.remove(sessions, "after_commit", operator_triggers_and_cancels)
        broker.close()

    assert operator_done and triggered == []
    with sessions() as session:
        run = session.get(PeriodRun, str(PERIOD))
        assert run is not None and run.state == RunState.CANCELLED
    assert queued_messages(settings.broker_url, settings.broker_namespace, "default") == 0
