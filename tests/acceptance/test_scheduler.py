"""``python -m scheduler`` as it runs in production: replicas, signals, reconcile ticks, bad configuration."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC
from datetime import time as clock_time
from pathlib import Path

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.fanout import runs
from reports.jobs import CoordinatorJob
from reports.models import PeriodRun
from reports.periods import Period, previous_month
from reports.settings import Settings
from scheduler.process import last_trigger_key
from scheduler.schedule import due_periods
from tests.support.broker import jobs_in_queue, messages_in_queue
from tests.support.environment import REPO
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

CATCH_UP_DONE = "Catch-up (start) done"


@dataclasses.dataclass
class SchedulerProcess:
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def start_scheduler(tmp_path: Path) -> Iterator[Callable[[Settings], SchedulerProcess]]:
    """Start ``python -m scheduler`` processes; every one is stopped at teardown, even on failure."""
    started: list[SchedulerProcess] = []

    def start(settings: Settings) -> SchedulerProcess:
        log_path = tmp_path / f"scheduler-{len(started)}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "scheduler"],
                env={**os.environ, **settings.as_environ()},
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(SchedulerProcess(process, log_path))
        return started[-1]

    yield start
    for scheduler in started:
        scheduler.stop(timeout=5)


def wait_for_log(scheduler: SchedulerProcess, text: str, *, timeout: float = 20) -> None:
    wait_until(
        lambda: text in scheduler.log() or scheduler.process.poll() is not None,
        timeout=timeout,
        what=f"{text!r} in the scheduler's log",
    )
    assert text in scheduler.log(), f"scheduler exited {scheduler.process.returncode}:\n{scheduler.log()}"


def plan_messages(settings: Settings) -> list[str]:
    messages = messages_in_queue(settings, "default")
    assert all(m["actor_name"] == "plan_period" and m["queue_name"] == "default" for m in messages), messages
    return sorted(str(job.period) for job in jobs_in_queue(settings, "default", CoordinatorJob))


def triggered_periods(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        return list(session.scalars(select(PeriodRun.period).order_by(PeriodRun.period)))


# --- replicas ----------------------------------------------------------------------------------


def test_two_replicas_at_once_trigger_each_due_period_once(settings, sessions, start_scheduler):
    settings = dataclasses.replace(settings, schedule_time="00:00", schedule_lookback_months=2)
    due = [str(p) for p in due_periods(utcnow(), clock_time(0, 0), UTC, 2)]
    assert len(due) == 2

    replicas = [start_scheduler(settings), start_scheduler(settings)]
    for replica in replicas:
        wait_for_log(replica, CATCH_UP_DONE)

    assert triggered_periods(sessions) == due
    assert plan_messages(settings) == due
    logs = "".join(replica.log() for replica in replicas)
    assert sum(logs.count(f"Triggered {period}: coordinator enqueued") for period in due) == len(due), logs
    last = json.loads(redis.Redis.from_url(settings.broker_url).get(last_trigger_key(settings.broker_namespace)))
    assert last["period"] in due and abs(last["at"] - time.time()) < 60
    for replica in replicas:
        assert replica.stop() == 0, replica.log()


# --- signals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_scheduler_cleanly_within_seconds(settings, sessions, start_scheduler, sig):
    # PostgreSQL trusts the test's connections, so a password in the URL is accepted and ignored:
    # it is there to show that the log never prints it.
    settings = dataclasses.replace(
        settings, database_url=settings.database_url.replace("postgres@", "postgres:s3cret-pw@", 1)
    )
    scheduler = start_scheduler(settings)
    wait_for_log(scheduler, CATCH_UP_DONE)

    began = time.monotonic()
    scheduler.process.send_signal(sig)
    code = scheduler.process.wait(timeout=5)

    assert code == 0, scheduler.log()
    assert time.monotonic() - began < 5
    log = scheduler.log()
    assert "stopped" in log
    assert "s3cret-pw" not in log
    assert "Traceback" not in log, log


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler of its own for ``sig`` (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (sig - 1) & 1)


def test_a_sigterm_while_the_scheduler_still_imports_is_a_clean_stop(settings, start_scheduler):
    # A deploy signals every process at once, a scheduler that has only just been started included.
    scheduler = start_scheduler(settings)
    wait_until(
        lambda: scheduler.process.poll() is not None or _catches(scheduler.process.pid, signal.SIGTERM),
        timeout=10,
        interval=0.002,
        what="the scheduler to catch SIGTERM",
    )
    scheduler.process.send_signal(signal.SIGTERM)

    assert scheduler.process.wait(timeout=10) == 0, scheduler.log()
    log = scheduler.log()
    assert "starting" not in log, "the signal came after the imports: this test needs it during them"
    assert "Traceback" not in log, log


# --- reconcile tick ----------------------------------------------------------------------------


def test_the_reconcile_tick_re_enqueues_a_lost_coordinator(settings, sessions, start_scheduler):
    settings = dataclasses.replace(
        settings,
        schedule_time="00:00",
        schedule_lookback_months=1,
        schedule_reconcile_interval_seconds=1,
        reconcile_stuck_after_seconds=0,
    )
    period = previous_month(utcnow())
    # Triggered, but its coordinator message was lost: nothing is enqueued.
    with sessions.begin() as session:
        assert runs.trigger(session, period, template_version=settings.template_version, now=utcnow()).created

    scheduler = start_scheduler(settings)
    wait_for_log(scheduler, f"{CATCH_UP_DONE}: due {period}; triggered none.")
    assert plan_messages(settings) == []

    wait_until(lambda: plan_messages(settings), timeout=10, what="a plan_period message from the reconcile tick")

    assert set(plan_messages(settings)) == {str(period)}
    wait_for_log(
        scheduler,
        f"Reconciled {period}: 0 pending (0 may still be on their way), 0 re-enqueued, "
        "0 send-now request(s) re-enqueued, coordinator re-enqueued",
    )
    assert triggered_periods(sessions) == [str(period)]
    assert scheduler.stop() == 0, scheduler.log()


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [("SCHEDULE_TIME", "25:00"), ("SCHEDULE_TIMEZONE", "Mars/Base"), ("SCHEDULE_LOOKBACK_MONTHS", "0")],
)
def test_bad_schedule_configuration_exits_2_with_one_clear_line(settings, variable, value):
    result = subprocess.run(
        [sys.executable, "-m", "scheduler"],
        env={**os.environ, **settings.as_environ(), variable: value},
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )

    described = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, described
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {variable} must be"), described
    assert value in lines[0], described
    assert result.stdout == "", described


def test_last_month_is_the_one_due_at_midnight_utc_with_a_lookback_of_one():
    # The reconcile test relies on last month being due with lookback 1 at 00:00 UTC.
    assert due_periods(utcnow(), clock_time(0, 0), UTC, 1) == [previous_month(utcnow())]
    assert Period.containing(utcnow()) not in due_periods(utcnow(), clock_time(0, 0), UTC, 12)
