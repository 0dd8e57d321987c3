"""The scheduler process: an APScheduler 3.x ``BlockingScheduler`` that only triggers, reconciles and prunes.

Its jobs (catch-up, reconcile, prune), their times and the Redis keys it keeps:
docs/reference/processes.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import FrameType

import redis
import sqlalchemy.exc
from apscheduler.events import EVENT_SCHEDULER_STARTED, SchedulerEvent  # type: ignore[import-untyped]
from apscheduler.schedulers import SchedulerNotRunningError  # type: ignore[import-untyped]
from apscheduler.schedulers.blocking import BlockingScheduler  # type: ignore[import-untyped]
from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]
from sqlalchemy.orm import Session, sessionmaker

from reports import logs
from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.endpoints import redact_url
from reports.errors import ConfigurationError
from reports.fanout import runs
from reports.jobs import QUEUES, CoordinatorJob
from reports.models import PeriodRun, RunState
from reports.ops import retention
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import Broker, build_broker, declare_queues, shared_redis
from reports.worker.queues import queue_for
from scheduler.schedule import Schedule

logger = logging.getLogger(__name__)

#: Exit code for configuration the process rejected at start (the CLI's code for bad input).
EXIT_BAD_CONFIGURATION = 2

#: Fraction of the reconcile interval the lock is held. Less than 1, so the replica that took
#: the lock can take it again on its next tick even if its clock runs a little ahead of Redis's.
LOCK_FRACTION = 0.9

#: A job this late (scheduler stalled, machine suspended) still runs once, in seconds.
MISFIRE_GRACE_SECONDS = 3600


def last_trigger_key(namespace: str) -> str:
    return f"{namespace}:scheduler:last_trigger"


def reconcile_lock_key(namespace: str) -> str:
    return f"{namespace}:scheduler:reconcile-lock"


def prune_lock_key(namespace: str) -> str:
    return f"{namespace}:scheduler:prune-lock"


#: How long the prune lock is held: one replica prunes, the others skip this day's run. Under a
#: day, so that the next day's run is not turned away by a lock taken a moment later the day before.
PRUNE_LOCK_MS = 23 * 3_600_000


class SchedulerProcess:
    """What the scheduler's jobs do, given the database, the broker and Redis it may use.

    :param clock: returns the current time as a naive UTC datetime.
    """

    def __init__(
        self,
        settings: Settings,
        schedule: Schedule,
        *,
        sessions: sessionmaker[Session],
        broker: Broker,
        redis_client: redis.Redis,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.schedule = schedule
        self.sessions = sessions
        self.broker = broker
        self.queue = queue_for(broker)
        self.redis = redis_client
        self.clock = clock
        #: Tells a job that is running when the process is asked to stop to finish early.
        self.stopping = threading.Event()
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    # --- catch-up ----------------------------------------------------------------------------

    def catch_up(self, reason: str) -> list[Period]:
        """Create a run for every due period that has none and enqueue its coordinator.

        Only the call that created a run enqueues its coordinator: of two replicas at once, the
        one whose insert lost enqueues nothing. Returns the periods this call triggered.
        """
        now = self.clock()
        due = self.schedule.due_periods(now)
        with self.sessions.begin() as session:
            missing = [period for period in due if session.get(PeriodRun, str(period)) is None]
        triggered: list[Period] = []
        for period in missing:
            if self.stopping.is_set():
                break
            with self.sessions.begin() as session:
                run = runs.trigger(
                    session,
                    period,
                    template_version=self.settings.template_version,
                    schedule=self.settings.send_schedule,
                    now=now,
                    resume=False,
                )
            # Committed before the send: if the send fails, reconcile re-enqueues the coordinator
            # of a walk that has not moved for RECONCILE_STUCK_AFTER_SECONDS.
            if run.created:
                self.queue.send_coordinator(str(run.run.walker), CoordinatorJob(period).payload())
                self._record_trigger(period)
                triggered.append(period)
                logger.info(
                    "Triggered %s: coordinator enqueued.",
                    period,
                    extra={"period": str(period), "replica": self.replica},
                )
            else:
                logger.info(
                    "%s was triggered meanwhile, by another replica or an operator%s; nothing enqueued.",
                    period,
                    ", and is cancelled" if run.run.state == RunState.CANCELLED else "",
                    extra={"period": str(period), "replica": self.replica},
                )
        logger.log(
            logging.INFO if reason != "tick" or triggered else logging.DEBUG,
            "Catch-up (%s) done: due %s; triggered %s.",
            reason,
            _names(due),
            _names(triggered),
            extra={"due": [str(p) for p in due], "triggered": [str(p) for p in triggered]},
        )
        return triggered

    def _record_trigger(self, period: Period) -> None:
        at = self.clock().replace(tzinfo=UTC).timestamp()
        self.redis.set(last_trigger_key(self.settings.broker_namespace), json.dumps({"period": str(period), "at": at}))

    # --- reconcile ---------------------------------------------------------------------------

    def tick(self) -> None:
        """The interval job: catch up (a period whose UTC month has just ended), then reconcile."""
        self.catch_up("tick")
        if self.stopping.is_set():
            return
        if not self._take_reconcile_lock():
            logger.debug("Reconcile skipped: another replica holds this interval's lock.")
            return
        self.reconcile_unfinished()

    def _take_reconcile_lock(self) -> bool:
        interval_ms = self.settings.schedule_reconcile_interval_seconds * 1000
        # Never released: it expires, so that one replica reconciles per interval, not one at a time.
        return bool(
            self.redis.set(
                reconcile_lock_key(self.settings.broker_namespace),
                self.replica,
                nx=True,
                px=max(1, int(interval_ms * LOCK_FRACTION)),
            )
        )

    def reconcile_unfinished(self) -> None:
        """Reconcile every active period that is not complete; one failing period does not stop the rest."""
        with self.sessions.begin() as session:
            periods = runs.unfinished(session)
        stuck_after = timedelta(seconds=self.settings.reconcile_stuck_after_seconds)
        for period in periods:
            if self.stopping.is_set():
                return
            try:
                found = runs.reconcile_through(
                    self.sessions,
                    self.queue,
                    period,
                    redis_client=self.redis,
                    namespace=self.settings.broker_namespace,
                    stuck_after=stuck_after,
                    now=self.clock(),
                )
            except (sqlalchemy.exc.SQLAlchemyError, redis.RedisError) as e:
                logger.error(
                    "Reconcile of %s failed (%s); retried next tick.",
                    period,
                    _describe(e),
                    extra={"period": str(period)},
                )
                continue
            acted = found.requeued or found.coordinator_enqueued or found.requests_requeued
            logger.log(
                logging.INFO if acted else logging.DEBUG,
                "Reconciled %s: %d pending (%d may still be on their way), %d re-enqueued, %d send-now "
                "request(s) re-enqueued%s.",
                period,
                found.pending,
                found.waiting,
                found.requeued,
                found.requests_requeued,
                ", coordinator re-enqueued"
                if found.coordinator_enqueued
                else ", walk paused on the backlog"
                if found.walk_paused
                else "",
                extra={
                    "period": str(period),
                    "requeued": found.requeued,
                    "coordinator_enqueued": found.coordinator_enqueued,
                },
            )
        try:
            requests = runs.reconcile_every_request(
                self.sessions,
                self.queue,
                redis_client=self.redis,
                namespace=self.settings.broker_namespace,
                stuck_after=stuck_after,
                now=self.clock(),
            )
        except (sqlalchemy.exc.SQLAlchemyError, redis.RedisError) as e:
            logger.error("Reconcile of send-now requests failed (%s); retried next tick.", _describe(e))
            return
        if requests:
            logger.info("Re-enqueued %d lost send-now request(s).", requests)

    # --- retention -------------------------------------------------------------------------

    def prune(self) -> retention.Pruned | None:
        """Prune the periods older than ``RETENTION_MONTHS``; ``None`` if another replica is at it."""
        months = self.settings.retention_months
        assert months is not None
        if not self.redis.set(prune_lock_key(self.settings.broker_namespace), self.replica, nx=True, px=PRUNE_LOCK_MS):
            logger.info("Prune skipped: another replica holds today's lock.")
            return None
        now = self.clock()
        before = retention.cutoff(now, months)
        result = retention.prune(
            self.sessions,
            before=before,
            should_stop=self.stopping.is_set,
            now=now,
            soft_bounce_window=self.settings.soft_bounce_window,
        )
        reopened = [Period.parse(p.period) for p in result.periods if p.reopened]
        feedback = result.feedback.deleted if result.feedback else 0
        logger.info(
            "Pruned %d row(s) of %d period(s) before %s%s%s%s%s.",
            result.rows,
            len(result.periods),
            before,
            f", and {feedback} feedback event(s)" if feedback else "",
            f"; kept unfinished {_names([Period.parse(p) for p in result.unfinished])}" if result.unfinished else "",
            f"; stopped at {_names(reopened)}, unfinished again" if reopened else "",
            "" if result.finished else "; stopped early, the rest at the next run",
            extra={
                "before": str(before),
                "rows": result.rows,
                "periods": [p.period for p in result.periods],
                "feedback_events": feedback,
            },
        )
        return result

    # --- the process -------------------------------------------------------------------------

    def build_scheduler(self) -> BlockingScheduler:
        scheduler = BlockingScheduler(timezone=UTC)
        defaults = {"coalesce": True, "max_instances": 1, "misfire_grace_time": MISFIRE_GRACE_SECONDS}
        scheduler.add_job(
            self._guarded(self.catch_up),
            args=("start",),
            id="catch-up-at-start",
            next_run_time=datetime.now(UTC),
            **defaults,
        )
        scheduler.add_job(
            self._guarded(self.catch_up),
            args=("monthly",),
            id="monthly-trigger",
            trigger=CronTrigger(
                day=1, hour=self.schedule.at.hour, minute=self.schedule.at.minute, timezone=self.schedule.timezone
            ),
            **defaults,
        )
        # East of UTC the monthly fire time comes before the UTC month has ended: trigger it the
        # moment it has, rather than waiting for the next reconcile tick.
        scheduler.add_job(
            self._guarded(self.catch_up),
            args=("month-end",),
            id="utc-month-start",
            trigger=CronTrigger(day=1, hour=0, minute=0, second=1, timezone=UTC),
            **defaults,
        )
        if self.settings.retention_months is not None:
            scheduler.add_job(
                self._guarded(self.prune),
                id="prune",
                # From the 2nd, a day clear of the 1st's fan-out, and each day after until the 28th:
                # a prune missed (no replica running at 03:00, the database down) or stopped
                # part way is done the next day, not a month later. A day with nothing older
                # than RETENTION_MONTHS left costs a few reads.
                trigger=CronTrigger(day="2-28", hour=3, minute=0, timezone=UTC),
                **defaults,
            )
        interval = self.settings.schedule_reconcile_interval_seconds
        if interval > 0:
            scheduler.add_job(
                self._guarded(self.tick),
                id="reconcile",
                trigger=IntervalTrigger(seconds=interval, timezone=UTC),
                **defaults,
            )
        return scheduler

    def _guarded(self, job: Callable[..., object]) -> Callable[..., None]:
        """``job``, with database and Redis failures logged as one line (no URL, no password)."""

        def run(*args: object) -> None:
            try:
                job(*args)
            except (sqlalchemy.exc.SQLAlchemyError, redis.RedisError) as e:
                logger.error("%s failed (%s); retried at the next run.", job.__name__, _describe(e))

        run.__name__ = run.__qualname__ = job.__name__
        return run

    def run(self) -> None:
        """Run until SIGTERM or SIGINT; running jobs stop at their next period boundary."""
        scheduler = self.build_scheduler()
        stop_lock = threading.Lock()

        def shut_down(reason: str) -> None:
            logger.info("%s: stopping (a running job stops at its next period).", reason)
            with stop_lock, contextlib.suppress(SchedulerNotRunningError):
                scheduler.shutdown(wait=False)

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            first = not self.stopping.is_set()
            self.stopping.set()
            if first and scheduler.running:
                # Not in the handler itself: it interrupts the main thread, which may hold a lock
                # that shutdown takes (the executor's), and would wait for itself.
                threading.Thread(
                    target=shut_down,
                    args=(f"Received {signal.Signals(signum).name}",),
                    name="scheduler-shutdown",
                    daemon=True,
                ).start()

        def on_started(_event: SchedulerEvent) -> None:
            # A signal that arrived while the scheduler was starting found nothing to shut down.
            if self.stopping.is_set():
                shut_down("Signalled while starting")

        scheduler.add_listener(on_started, EVENT_SCHEDULER_STARTED)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        logger.info(
            "Scheduler %s starting: monthly on the 1st at %s %s%s, look-back %d month(s), reconcile every %ss; "
            "database %s, broker %s (namespace %s).",
            self.replica,
            self.schedule.at.strftime("%H:%M"),
            self.schedule.timezone,
            " (as the month ends: SEND_AT_LOCAL_TIME is set)" if self.schedule.at_month_end else "",
            self.schedule.lookback_months,
            self.settings.schedule_reconcile_interval_seconds,
            redact_url(self.settings.database_url),
            redact_url(self.settings.broker_url),
            self.settings.broker_namespace,
        )
        if not self.stopping.is_set():
            scheduler.start()
        logger.info("Scheduler %s stopped.", self.replica)


def _names(periods: list[Period]) -> str:
    return ", ".join(map(str, periods)) or "none"


def _describe(error: Exception) -> str:
    """The error's kind only: driver messages can carry connection URLs."""
    original = getattr(error, "orig", None)
    return type(original or error).__name__


def configure_logging(level: str) -> None:
    """Log to stderr at ``level``; APScheduler's per-run chatter only at DEBUG."""
    logs.configure(level)
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("apscheduler").setLevel(logging.WARNING)


def main() -> int:
    """``python -m scheduler``: read the configuration once, then run until signalled."""
    try:
        settings = Settings.from_env()
        schedule = Schedule.from_settings(settings)
        broker = build_broker(settings)
        # Before the log is set up: a queue of the other type is then the one line on stderr.
        declare_queues(broker, QUEUES)
        configure_logging(settings.log_level)
    except ConfigurationError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIGURATION

    engine = create_db_engine(settings.database_url)
    try:
        SchedulerProcess(
            settings,
            schedule,
            sessions=session_factory(engine),
            broker=broker,
            redis_client=shared_redis(broker, settings),
        ).run()
    except KeyboardInterrupt:
        # Only before the handlers are installed; afterwards SIGINT stops the scheduler cleanly.
        pass
    finally:
        broker.close()
        engine.dispose()
    return 0
