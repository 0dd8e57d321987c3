"""What ``reports demo`` prints: the period's summary, and how to use what it keeps running."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from reports import tokens
from reports.database import sqlite_file
from reports.endpoints import redact_url
from reports.fanout import progress
from reports.ops.demo_processes import WEB_HOST, WEB_PORT
from reports.periods import Period
from reports.settings import Settings


def reports_command() -> str:
    """How to run ``reports`` from a shell: scripts/demo installs it in .venv, which is not on the PATH."""
    script = Path(sys.executable).parent / "reports"
    found = shutil.which("reports")
    if found and script.exists() and Path(found).resolve() == script.resolve():
        return "reports"
    return str(script) if script.exists() else f"{sys.executable} -m reports"


def print_summary(
    console: Console,
    settings: Settings,
    final: progress.Progress,
    *,
    inactive: int,
    log_path: Path,
    serving: bool = False,
) -> None:
    outbox = settings.outbox_dir / "new"
    mails = sum(1 for _ in outbox.iterdir()) if outbox.is_dir() else 0
    table = Table(title=f"Monthly reports for {final.period}", show_header=False)
    for label, value in (
        ("users reported", final.total),
        ("delivered", final.delivered),
        # Inactive users are never planned (the walk reads active users only), so they have no
        # item; "skipped" counts the users deactivated or deleted after the walk recorded their item.
        ("not planned (inactive)", inactive),
        ("skipped (deactivated since planned)", final.skipped),
        ("dead", final.dead),
        ("complete", final.complete),
        ("mails in the outbox (all runs)", mails),
    ):
        table.add_row(label, f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value))
    console.print(table)
    # Paths go outside the table, whole, so a narrow terminal cannot cut them short.
    console.print(f"Mail (Maildir): {outbox}", soft_wrap=True)
    console.print(f"Reports: table `reports` in {redact_url(settings.database_url)}", soft_wrap=True)
    console.print(f"Worker log: {log_path}", soft_wrap=True)
    if not settings.unsubscribe_secret:
        console.print(
            f"Unsubscribe links point at {settings.public_base_url} (`reports web`) and are signed with "
            "the built-in development secret; a real deployment sets UNSUBSCRIBE_SECRET.",
            soft_wrap=True,
        )
    if not serving:
        reports = reports_command()
        _plain(
            console,
            f"Look around: {reports} periods, {reports} dlq list "
            "(`source .venv/bin/activate` puts `reports` on the PATH).",
        )
        _plain(console, f"To try trigger, send-now and dlq replay on this data: {reports} demo --serve.")


def environment_lines(settings: Settings) -> list[str]:
    """``export`` lines that point another shell at what the demo serves, from any folder."""
    lines = [f"export BROKER_URL={shlex.quote(settings.broker_url)}"]
    if sqlite_file(settings.database_url) is not None:
        lines.append(f"export DATABASE_URL={shlex.quote(settings.database_url)}")
    lines.append(f"export VAR_DIR={shlex.quote(str(settings.var_dir))}")
    if settings.broker_namespace != Settings.broker_namespace:
        lines.append(f"export BROKER_NAMESPACE={shlex.quote(settings.broker_namespace)}")
    return lines


def print_serving(console: Console, settings: Settings, *, period: Period, user_id: int | None) -> None:
    reports = reports_command()
    _plain(console, "\nThe embedded Redis, the workers and the web process keep running until Ctrl-C.")
    _plain(console, f"Web process: http://{WEB_HOST}:{WEB_PORT}/healthz (its log: {settings.var_dir / 'web.log'})")
    if user_id is not None:
        # A real link, as user_id's email carries it: it opens the confirm page of the web process.
        _plain(console, f"User {user_id}'s unsubscribe link: {tokens.links(settings).url(user_id)}")
    _plain(console, "In a second terminal:")
    for line in environment_lines(settings):
        _plain(console, f"  {line}")
    if sqlite_file(settings.database_url) is None:
        # Never printed: it may carry a password. The second shell needs the same one.
        _plain(console, "  (and the DATABASE_URL this demo runs on)")
    _plain(console, "then try:")
    if user_id is not None:
        _plain(console, f"  {reports} send-now {user_id} {period}   # one report again, a new email in the outbox")
    _plain(console, f"  {reports} trigger {period}   # idempotent: nothing is sent twice")
    _plain(console, f"  {reports} progress {period}")
    _plain(console, f"  {reports} dlq list")
    console.file.flush()


def _plain(console: Console, text: str) -> None:
    # No markup or highlighting: these lines are copied into a shell as they are.
    console.print(text, soft_wrap=True, markup=False, highlight=False)
