"""``reports reconcile``: count a period against what should exist and re-send what is stuck."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import click

from reports.cli.app import Obj, cli, pass_obj, period_argument
from reports.clock import utcnow
from reports.errors import BadInput
from reports.fanout import runs
from reports.periods import Period
from reports.settings import MAX_SECONDS
from reports.worker.broker import build_broker, shared_redis
from reports.worker.queues import queue_for


def _seconds(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise BadInput(f"--stuck-after must be a number of seconds from 0 to {MAX_SECONDS}.")
    return value


@cli.command()
@period_argument(closed=False)
@click.option(
    "--stuck-after",
    type=float,
    default=None,
    callback=_seconds,
    help="Seconds a pending item must be untouched to count as stuck (default: RECONCILE_STUCK_AFTER_SECONDS, 600).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_obj
def reconcile(obj: Obj, period: Period, stuck_after: float | None, as_json: bool) -> None:
    """Count PERIOD against what should exist; re-enqueue stuck items and an unfinished walk."""
    broker = build_broker(obj.settings)
    found = runs.reconcile_through(
        obj.sessions(),
        queue_for(broker),
        period,
        redis_client=shared_redis(broker, obj.settings),
        namespace=obj.settings.broker_namespace,
        stuck_after=timedelta(
            seconds=obj.settings.reconcile_stuck_after_seconds if stuck_after is None else stuck_after
        ),
        now=utcnow(),
    )
    if as_json:
        click.echo(json.dumps(found.as_dict()))
        return
    click.echo(
        f"{found.period}: {found.active_users} active users, {found.items} items "
        f"({found.active_without_item} active users without one); {found.finished} finished, "
        f"{found.pending} pending ({found.waiting} may still be on their way"
        + (f", {found.scheduled} not yet due" if found.scheduled else "")
        + f"); re-enqueued {found.requeued} lost item(s) and {found.requests_requeued} send-now request(s)"
        + (
            f"; cancelled: its items wait until `reports trigger {found.period}` resumes it."
            if found.cancelled
            else "; walk complete, release chain re-enqueued."
            if found.planned and found.coordinator_enqueued
            else "; walk complete."
            if found.planned
            else "; coordinator re-enqueued to finish the walk."
            if found.coordinator_enqueued
            else "; walk paused on the bulk queue's backlog."
            if found.walk_paused
            else "; walk in progress."
        )
    )
