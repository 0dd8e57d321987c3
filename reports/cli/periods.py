"""``reports trigger`` and ``reports progress``: start a period and watch it."""

from __future__ import annotations

import json

import click
from rich.console import Console

from reports.cli.app import FiniteFloatRange, Obj, cli, pass_obj, period_argument
from reports.clock import utcnow
from reports.fanout import progress, runs
from reports.ops.watch import watch as watch_progress
from reports.periods import Period
from reports.worker.broker import build_broker

#: Longest pause between two reads while watching, in seconds.
MAX_WATCH_INTERVAL_SECONDS = 3600


@cli.command()
@period_argument(closed=True)
@pass_obj
def trigger(obj: Obj, period: Period) -> None:
    """Start (or resume) the monthly run for PERIOD (YYYY-MM, a month that has ended)."""
    triggered = runs.trigger_and_enqueue(
        obj.sessions(),
        build_broker(obj.settings),
        period,
        template_version=obj.settings.template_version,
        now=utcnow(),
    )
    counts = None
    if not (triggered.created or triggered.resumed or triggered.needs_coordinator):
        with obj.sessions().begin() as session:
            counts = progress.count(session, period)
    click.echo(describe_trigger(triggered, counts))


def describe_trigger(triggered: runs.Triggered, counts: progress.Progress | None = None) -> str:
    """What a trigger did, in one line; ``counts`` are the period's, read when it had walked every user."""
    run = triggered.run
    if triggered.resumed:
        return (
            f"{run.period} resumed: pending reports re-enqueued"
            + ("" if run.planned else ", and the coordinator")
            + "."
        )
    if triggered.created:
        return f"Triggered {run.period}: coordinator enqueued (template {run.template_version})."
    if triggered.needs_coordinator:
        where = "from the first user" if run.cursor is None else f"after user {run.cursor}"
        return f"{run.period} was already triggered; coordinator enqueued to resume {where}."
    if counts is not None and counts.complete:
        return (
            f"{run.period} is already complete ({counts.delivered:,} delivered, {counts.skipped:,} skipped, "
            f"{counts.dead:,} dead); nothing enqueued, nothing sent."
        )
    return f"{run.period} is already planned; nothing enqueued."


@cli.command("progress")
@period_argument(closed=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--watch", is_flag=True, help="Show a live progress bar until the period is complete.")
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
            return progress.count(session, period)

    current = read()
    if watch:
        current = watch_progress(read, interval_seconds=interval, console=Console(stderr=as_json))
    if as_json:
        click.echo(json.dumps(current.as_dict()))
    else:
        click.echo(f"{current.period}: {current.line()}")
