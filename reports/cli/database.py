"""``reports db upgrade`` and ``reports seed``: the schema and demo data."""

from __future__ import annotations

import click
import sqlalchemy.exc

from reports.cli.app import Obj, cli, pass_obj, period_option
from reports.clock import utcnow
from reports.database import LOCK_NOT_AVAILABLE, MIGRATION_LOCK_TIMEOUT_MS, upgrade
from reports.errors import ReportsError
from reports.ops.seed import seed as seed_users
from reports.periods import Period, previous_month

#: Most users one ``seed`` adds: their rows are built in memory before the insert.
MAX_SEED_USERS = 10_000_000


@cli.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@pass_obj
def db_upgrade(obj: Obj) -> None:
    """Migrate the database to the newest schema."""
    try:
        upgrade(obj.settings)
    except sqlalchemy.exc.OperationalError as error:
        if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        raise ReportsError(
            f"A migration waited {MIGRATION_LOCK_TIMEOUT_MS // 1000} s for a table that another transaction holds "
            "(a long query, or a session idle in a transaction) and gave up; nothing was changed. Run it again."
        ) from None
    click.echo("Database is at the newest schema.")


@cli.command()
@click.option("--users", type=click.IntRange(1, MAX_SEED_USERS), required=True, help="How many users to add.")
@click.option(
    "--period", "period_text", callback=period_option, help="Month to give them activities in (default: last month)."
)
@click.option("--inactive-percent", type=click.IntRange(0, 100), default=10, show_default=True)
@pass_obj
def seed(obj: Obj, users: int, period_text: str | None, inactive_percent: int) -> None:
    """Load demo users with activities in a month and the month before."""
    period = Period.parse(period_text) if period_text else previous_month(utcnow())
    with obj.session() as session:
        seeded = seed_users(session, users=users, period=period, inactive_percent=inactive_percent)
    click.echo(
        f"Seeded users {seeded.first_id}..{seeded.last_id} ({seeded.inactive} inactive) "
        f"with {seeded.activities} activities in {period.previous()} and {period}."
    )
