"""The ``reports`` command: the operator's entry point. Reads the environment once, here."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Iterator

import click
import redis
import sqlalchemy.exc
from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from reports import progress, runs
from reports.broker import build_broker
from reports.clock import utcnow
from reports.database import create_db_engine, session_factory, upgrade
from reports.errors import BadInput, ConfigurationError
from reports.periods import Period, parse_closed, previous_month
from reports.settings import Settings

#: Exit code for input the command rejected without changing anything.
EXIT_BAD_INPUT = 2


class _Obj:
    """What every command shares: the settings and, on first use, the database."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._engine: sqlalchemy.Engine | None = None

    def sessions(self) -> sessionmaker[Session]:
        if self._engine is None:
            self._engine = create_db_engine(self.settings.database_url)
        return session_factory(self._engine)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions().begin() as session:
            yield session


pass_obj = click.make_pass_decorator(_Obj)


@click.group()
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Monthly reports: plan, send and watch one email per active user per month."""
    ctx.obj = _Obj(Settings.from_env())


@cli.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@pass_obj
def db_upgrade(obj: _Obj) -> None:
    """Migrate the database to the newest schema."""
    upgrade(obj.settings)
    click.echo("Database is at the newest schema.")


def _period_argument(closed: bool) -> Callable[[Any], Any]:
    def convert(_ctx: click.Context, _param: click.Parameter, value: str) -> Period:
        return parse_closed(value, utcnow()) if closed else Period.parse(value)

    return click.argument("period", callback=convert)


@cli.command()
@click.option("--users", type=click.IntRange(min=1), required=True, help="How many users to add.")
@click.option("--period", "period_text", help="Month to give them activities in (default: last month).")
@click.option("--inactive-percent", type=click.IntRange(0, 100), default=10, show_default=True)
@pass_obj
def seed(obj: _Obj, users: int, period_text: str | None, inactive_percent: int) -> None:
    """Load demo users with activities in a month and the month before."""
    from reports.seed import seed as seed_users

    period = Period.parse(period_text) if period_text else previous_month(utcnow())
    with obj.session() as session:
        seeded = seed_users(session, users=users, period=period, inactive_percent=inactive_percent)
    click.echo(
        f"Seeded users {seeded.first_id}..{seeded.last_id} ({seeded.inactive} inactive) "
        f"with {seeded.activities} activities in {period.previous()} and {period}."
    )


@cli.command()
@_period_argument(closed=True)
@pass_obj
def trigger(obj: _Obj, period: Period) -> None:
    """Start (or resume) the monthly run for PERIOD (YYYY-MM, a month that has ended)."""
    triggered = runs.trigger_and_enqueue(
        obj.sessions(), build_broker(obj.settings), period, template_version=obj.settings.template_version,
        now=utcnow(),
    )
    click.echo(describe_trigger(triggered))


def describe_trigger(triggered: runs.Triggered) -> str:
    run = triggered.run
    if triggered.created:
        return f"Triggered {run.period}: coordinator enqueued (template {run.template_version})."
    if triggered.needs_coordinator:
        return f"{run.period} was already triggered; coordinator enqueued to resume after user {run.cursor}."
    return f"{run.period} is already planned; nothing enqueued."


@cli.command("progress")
@_period_argument(closed=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--watch", is_flag=True, help="Show a live progress bar until the period is complete.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between reads while watching.")
@pass_obj
def progress_command(obj: _Obj, period: Period, as_json: bool, watch: bool, interval: float) -> None:
    """Counts of PERIOD's items by state."""
    def read() -> progress.Progress:
        with obj.session() as session:
            return progress.count(session, period)

    current = read()
    if watch:
        from reports.watch import watch as watch_progress

        current = watch_progress(read, interval_seconds=interval, console=Console(stderr=as_json))
    if as_json:
        click.echo(json.dumps(current.as_dict()))
    else:
        click.echo(
            f"{current.period}: {current.finished}/{current.total} finished "
            f"(delivered {current.delivered}, skipped {current.skipped}, dead {current.dead}, "
            f"pending {current.pending}); planned={str(current.planned).lower()} "
            f"complete={str(current.complete).lower()}"
        )


@cli.command()
@click.option("--users", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Users to seed on the first run.")
@click.option("--processes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=4, show_default=True)
@pass_obj
def demo(obj: _Obj, users: int, processes: int, threads: int) -> None:
    """Run last month's reports end to end on the embedded default (SQLite, embedded Redis, Maildir)."""
    from reports.demo import run_demo

    run_demo(obj.settings, users=users, processes=processes, threads=threads, console=Console())


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; rejected input is one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="reports", standalone_mode=False)
    except (BadInput, ConfigurationError) as e:
        _fail(str(e), EXIT_BAD_INPUT)
    except click.UsageError as e:
        _fail(e.format_message(), EXIT_BAD_INPUT)
    except click.Abort:
        _fail("Aborted.", 130)
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError) as e:
        # The driver's text can carry the URL; show only the error's kind.
        _fail(f"Database error ({type(e.orig).__name__}); is it reachable and migrated (`reports db upgrade`)?", 1)
    except redis.RedisError as e:
        _fail(f"Broker error ({type(e).__name__}); is Redis reachable at BROKER_URL?", 1)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
