"""``reports prune``: delete what periods older than N months left behind (see :mod:`reports.ops.retention`)."""

from __future__ import annotations

import click

from reports.cli.app import Obj, cli, pass_obj
from reports.clock import utcnow
from reports.ops import retention
from reports.settings import MAX_RETENTION_MONTHS


@cli.command()
@click.option(
    "--older-than-months",
    "months",
    type=click.IntRange(1, MAX_RETENTION_MONTHS),
    required=True,
    help="Prune the periods that ended more than this many months before the current one.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; change nothing.")
@pass_obj
def prune(obj: Obj, months: int, dry_run: bool) -> None:
    """Delete old periods' report items, deliveries and stored reports.

    On PostgreSQL each period goes by dropping its monthly partitions; on SQLite in short batches.
    Keeps unfinished periods, what unreplayed dead letters need, and every period's run. Then
    deletes the provider feedback events received before the oldest month kept, but not those of
    the soft-bounce window or that a suppression points to.
    Stopped part-way, it is resumed by running it again; a period that a dead-letter replay or a
    send-now makes unfinished meanwhile keeps the rest of its rows.
    """
    now = utcnow()
    before = retention.cutoff(now, months)
    result = retention.prune(
        obj.sessions(),
        before=before,
        dry_run=dry_run,
        now=now,
        soft_bounce_window=obj.settings.soft_bounce_window,
    )
    for line in describe(result, dry_run=dry_run):
        click.echo(line)
    verb = "Would delete" if dry_run else "Deleted"
    click.echo(f"{verb} {result.rows:,} row(s) of {len(result.periods)} period(s) before {before}.")


def describe(result: retention.Pruned, *, dry_run: bool) -> list[str]:
    """One line per old period: what goes (or would), what stays and why."""
    lines = []
    for pruned in result.periods:
        parts = ", ".join(f"{n:,} {name}" for name, n in pruned.deleted.items())
        kept = (
            f"; kept {pruned.kept_for_dead_letters:,} user(s) an unreplayed dead letter needs"
            if pruned.kept_for_dead_letters
            else ""
        )
        reopened = "; stopped there, a replay or a send-now made its run unfinished" if pruned.reopened else ""
        if pruned.busy:
            lines.append(f"{pruned.period}: kept whole, other transactions kept its tables busy; run the prune again.")
            continue
        lines.append(f"{pruned.period}: {'would delete' if dry_run else 'deleted'} {parts}{kept}{reopened}.")
    lines += [f"{period}: kept whole, its run is unfinished." for period in result.unfinished]
    if (feedback := result.feedback) and (feedback.deleted or feedback.kept_for_suppressions):
        kept = (
            f"; kept {feedback.kept_for_suppressions:,} a suppression points to"
            if feedback.kept_for_suppressions
            else ""
        )
        lines.append(
            f"Feedback events received before {feedback.before:%Y-%m-%d %H:%M} UTC: "
            f"{'would delete' if dry_run else 'deleted'} {feedback.deleted:,}{kept}."
        )
    return lines
