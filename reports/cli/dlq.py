"""``reports dlq``: the dead letters as a work list: list, show, replay, purge."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import click

from reports.cli.app import Obj, cli, echo_listing, iso_utc, pass_obj, period_option, text_option
from reports.clock import utcnow
from reports.errors import BadInput
from reports.failures import dead_letters
from reports.models import DeadLetter
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for

#: ``dead_letters.id`` is a 32-bit integer: a larger id matches nothing and overflows SQLite's binding.
DEAD_LETTER_ID = click.IntRange(1, 2**31 - 1)

#: Most dead letters one ``list`` prints.
MAX_LIST_LIMIT = 1_000_000

#: Oldest age ``purge`` takes, in days: a century; more overflows the date arithmetic.
MAX_PURGE_DAYS = 36_525


def _as_dict(letter: DeadLetter, *, full: bool = False) -> dict[str, Any]:
    row = {
        "id": letter.id,
        "message_id": letter.message_id,
        "actor": letter.actor,
        "queue": letter.queue,
        "period": letter.period,
        "user_id": letter.user_id,
        "attempts": letter.attempts,
        "reason": letter.reason,
        "error_class": letter.error_class,
        "error_message": letter.error_message,
        "first_failed_at": iso_utc(letter.first_failed_at),
        "died_at": iso_utc(letter.died_at),
        "replayed_at": iso_utc(letter.replayed_at),
    }
    if full:
        row |= {
            "payload": json.loads(letter.payload),
            "traceback": letter.traceback,
            "replay_message_id": letter.replay_message_id,
        }
    return row


@cli.group()
def dlq() -> None:
    """Dead letters: messages that failed for good."""


@dlq.command("list")
@click.option("--period", callback=period_option, help="Only this period (YYYY-MM).")
@click.option("--reason", callback=text_option, help="Only those whose reason or error contains this text (e.g. 550).")
@click.option("--replayed", is_flag=True, help="Include dead letters already replayed.")
@click.option("--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@pass_obj
def list_command(obj: Obj, period: str | None, reason: str | None, replayed: bool, limit: int, as_json: bool) -> None:
    """List dead letters, oldest first."""
    where = dead_letters.Filter(period=period, reason=reason, include_replayed=replayed)
    with obj.session() as session:
        rows = (_as_dict(letter) for letter in dead_letters.find(session, where, limit=limit))
        echo_listing(rows, as_json=as_json, line=_line, counted="dead letter(s)")


def _line(row: dict[str, Any]) -> str:
    """One plain line per dead letter: nothing to cut on a narrow terminal, easy to grep."""
    return (
        f"#{row['id']}  {row['died_at']}  {row['period'] or '-'}  "
        f"user {'-' if row['user_id'] is None else row['user_id']}  "
        f"{row['actor']}  {row['reason']} after {row['attempts']}  "
        f"{row['error_class']}: {row['error_message'][:120]}"
    )


@dlq.command("show")
@click.argument("dead_letter_id", type=DEAD_LETTER_ID)
@pass_obj
def show(obj: Obj, dead_letter_id: int) -> None:
    """Everything stored about one dead letter, as JSON."""
    with obj.session() as session:
        letter = dead_letters.get(session, dead_letter_id)
        if letter is None:
            raise BadInput(f"No dead letter with id {dead_letter_id}.")
        click.echo(json.dumps(_as_dict(letter, full=True), indent=2))


@dlq.command("replay")
@click.option("--id", "ids", type=DEAD_LETTER_ID, multiple=True, help="A dead letter to replay (repeatable).")
@click.option("--period", callback=period_option, help="Every dead letter of this period.")
@click.option("--all", "everything", is_flag=True, help="Every dead letter not yet replayed.")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; change nothing.")
@pass_obj
def replay(obj: Obj, ids: tuple[int, ...], period: str | None, everything: bool, dry_run: bool) -> None:
    """Enqueue dead letters again as fresh messages; a user already mailed is not mailed again."""
    if sum((bool(ids), period is not None, everything)) != 1:
        raise BadInput("Choose exactly one of --id, --period or --all.")
    if ids:
        with obj.session() as session:
            known = {
                letter.id for letter in dead_letters.find(session, dead_letters.Filter(ids=ids, include_replayed=True))
            }
        if missing := sorted(set(ids) - known):
            raise BadInput(f"No dead letter with id {', '.join(map(str, missing))}.")
    outcome = dead_letters.replay(
        obj.sessions(),
        queue_for(build_broker(obj.settings)),
        dead_letters.Filter(period=period, ids=ids),
        now=utcnow(),
        dry_run=dry_run,
    )
    listed = ", ".join(map(str, outcome.replayed[:20])) + (" …" if len(outcome.replayed) > 20 else "")
    if dry_run:
        click.echo(f"Would replay {len(outcome.replayed)} dead letter(s){': ' + listed if listed else ''}.")
    else:
        click.echo(
            f"Replayed {len(outcome.replayed)} dead letter(s){': ' + listed if listed else ''}; "
            f"{outcome.items_reset} report item(s) back to pending."
        )
    if outcome.suppressed:
        users = ", ".join(map(str, outcome.suppressed[:20])) + (" …" if len(outcome.suppressed) > 20 else "")
        click.echo(
            f"note: {len(outcome.suppressed)} of these users are on the suppression list ({users}): their reports "
            "are skipped, not sent. `reports suppress remove USER` first if their address is fixed.",
            err=True,
        )


@dlq.command("purge")
@click.option("--older-than", "days", type=click.IntRange(0, MAX_PURGE_DAYS), required=True, help="Age in days.")
@pass_obj
def purge(obj: Obj, days: int) -> None:
    """Delete dead letters that died more than DAYS days ago."""
    with obj.session() as session:
        purged = dead_letters.purge(session, older_than=timedelta(days=days), now=utcnow())
    click.echo(f"Purged {purged} dead letter(s) older than {days} day(s).")
