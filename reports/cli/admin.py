"""Admin operations: ``reports periods``, ``reports cancel`` and ``reports send-now``."""

from __future__ import annotations

import json
import uuid

import click

from reports.cli.app import Obj, cli, pass_obj, period_argument
from reports.clock import utcnow
from reports.delivery import claims
from reports.delivery.mail import backend
from reports.delivery.mail.compose import message_id
from reports.errors import BadInput
from reports.fanout import progress, runs
from reports.jobs import MAX_USER_ID, MIN_USER_ID, SEND_NOW, SendNowJob
from reports.models import PeriodRun, User
from reports.periods import Period
from reports.worker.broker import build_broker, send


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@pass_obj
def periods(obj: Obj, as_json: bool) -> None:
    """Every period ever triggered, newest first, with its state and counts."""
    with obj.session() as session:
        summaries = progress.every_period(session)
    if as_json:
        click.echo(json.dumps([summary.as_dict() for summary in summaries]))
        return
    for summary in summaries:
        click.echo(f"{summary.progress.period}  {summary.status:<9}  {summary.progress.line()}")
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
    request_id = str(uuid.uuid4())
    with obj.session() as session:
        user = session.get(User, user_id)
        if user is None:
            raise BadInput(f"No user with id {user_id}.")
        if not user.active and not include_inactive:
            raise BadInput(f"User {user_id} is deactivated; pass --include-inactive to send anyway.")
        # Held until the request is committed, so a prune of the period under way sees it.
        runs.hold_off_pruning(session, [str(period)])
        run = session.get(PeriodRun, str(period))
        if run is None and not allow_untriggered:
            raise BadInput(
                f"Period {period} has never been triggered; pass --allow-untriggered to send its report anyway."
            )
        job = SendNowJob(
            period, user_id, request_id, run.template_version if run is not None else obj.settings.template_version
        )
        # Written before the message exists: if Redis loses it, reconcile sends the request again.
        claims.record_send_now_request(
            session,
            request_id,
            period,
            user_id,
            template_version=job.template_version,
            message_id=message_id(period, user_id, obj.settings.mail_domain, request_id=request_id),
            now=utcnow(),
        )
    send(build_broker(obj.settings), SEND_NOW, job.payload())
    click.echo(f"Queued send-now request {job.request_id}: user {user_id}, period {period}, critical queue.")
    click.echo(f"Its email goes to {backend.destination(obj.settings)} once a critical-queue worker sends it.")
    click.echo(
        "To see its state (requested, claimed, sent or dead): "
        f"SELECT state, sent_at FROM resends WHERE request_id = '{job.request_id}';"
    )
