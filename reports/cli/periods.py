"""``reports trigger`` and ``reports progress``: start a period and watch it."""

from __future__ import annotations

import json

import click
from rich.console import Console

from reports.cli.app import FiniteFloatRange, Obj, cli, pass_obj, period_argument
from reports.clock import utcnow
from reports.errors import PeriodCancelled
from reports.fanout import progress, runs
from reports.ops.watch import watch as watch_progress
from reports.periods import Period
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for

#: Longest pause between two reads while watching, in seconds.
MAX_WATCH_INTERVAL_SECONDS = 3600


@cli.command()
@period_argument(closed=True)
@pass_obj
def trigger(obj: Obj, period: Period) -> None:
    """Start (or resume) the monthly run for PERIOD (YYYY-MM, a month that has ended)."""
    triggered = runs.trigger_and_enqueue(
        obj.sessions(),
        queue_for(build_broker(obj.settings)),
        period,
        template_version=obj.settings.template_version,
        schedule=obj.settings.send_schedule,
        now=utcnow(),
    )
    click.echo(triggered.describe())


@cli.command("progress")
@period_argument(closed=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--watch",
    is_flag=True,
    help="Show a live progress bar until the period is complete (exit 1 if it is cancelled).",
)
@click.option(
    "--interval",
    type=FiniteFloatRange(min=0.1, max=MAX_WATCH_INTERVAL_SECONDS),
    default=1.0,
    show_default=True,
    help="Seconds between reads while watching.",
)
@pass_obj
def progress_command(obj: Obj, period: Period, as_json: bool, watch: bool, interval: float) -> None:
    """Counts of PERIOD's items by state."""

    def read() -> progress.Progress:
        with obj.session() as session:
            return progress.count(session, period, utcnow())

    current = read()
    if watch and not current.cancelled:
        current = watch_progress(read, interval_seconds=interval, console=Console(stderr=as_json))
    if as_json:
        click.echo(json.dumps(current.as_dict()))
    else:
        cancelled = f"; cancelled: `reports trigger {period}` resumes it" if current.cancelled else ""
        click.echo(f"{current.period}: {current.line()}{cancelled}")
    if watch and current.cancelled:
        # Waiting on would be for ever: nothing of a cancelled month is sent until it is resumed.
        raise PeriodCancelled(f"{period} is cancelled: it completes only once `reports trigger {period}` resumes it.")
