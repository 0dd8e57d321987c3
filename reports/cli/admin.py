"""Admin operations: ``reports periods``, ``reports cancel`` and ``reports send-now``."""

from __future__ import annotations

import json

import click

from reports.cli.app import Obj, cli, pass_obj, period_argument
from reports.clock import utcnow
from reports.delivery.mail import backend
from reports.fanout import progress, runs
from reports.jobs import MAX_USER_ID, MIN_USER_ID
from reports.ops import send_now as send_now_request
from reports.periods import Period
from reports.worker.broker import build_broker


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@pass_obj
def periods(obj: Obj, as_json: bool) -> None:
    """Every period ever triggered, newest first, with its state and counts."""
    with obj.session() as session:
        summaries = progress.every_period(session, utcnow())
    if as_json:
        click.echo(json.dumps([summary.as_dict() for summary in summaries]))
        return
    for summary in summaries:
        click.echo(f"{summary.progress.period}  {summary.progress.status:<9}  {summary.progress.line()}")
    click.echo(f"{len(summaries)} period(s).")


@cli.command()
@period_argument(closed=False)
@pass_obj
def cancel(obj: Obj, period: Period) -> None:
    """Stop PERIOD: no new sends; what is in flight finishes. `reports trigger PERIOD` resumes it."""
    with obj.session() as session:
        changed = runs.cancel(session, period, now=utcnow())
    click.echo(
        f"{period} cancelled; `reports trigger {period}` resumes it."
        if changed
        else f"{period} was already cancelled; nothing changed."
    )


@cli.command("send-now")
@click.argument("user_id", type=click.IntRange(min=MIN_USER_ID, max=MAX_USER_ID))
@period_argument(closed=True)
@click.option("--include-inactive", is_flag=True, help="Send even though the user is deactivated.")
@click.option("--allow-untriggered", is_flag=True, help="Send even though PERIOD has never been triggered.")
@pass_obj
def send_now(obj: Obj, user_id: int, period: Period, include_inactive: bool, allow_untriggered: bool) -> None:
    """Send USER_ID's report for PERIOD now, on the critical queue (again, if it was sent before)."""
    job = send_now_request.request(
        obj.sessions(),
        build_broker(obj.settings),
        obj.settings,
        user_id,
        period,
        now=utcnow(),
        include_inactive=include_inactive,
        allow_untriggered=allow_untriggered,
    )
    click.echo(f"Queued send-now request {job.request_id}: user {user_id}, period {period}, critical queue.")
    click.echo(f"Its email goes to {backend.destination(obj.settings)} once a critical-queue worker sends it.")
    click.echo(
        "To see its state (requested, claimed, sent or dead): "
        f"SELECT state, sent_at FROM resends WHERE request_id = '{job.request_id}';"
    )
