"""``reports suppress add|remove|list``: the suppression list, by hand (complaints, corrections), with
the provider event behind each entry that a webhook made."""

from __future__ import annotations

from typing import Any

import click

from reports import suppressions
from reports.cli.app import Obj, cli, echo_listing, iso_utc, pass_obj
from reports.clock import utcnow
from reports.errors import BadInput
from reports.jobs import MAX_USER_ID, MIN_USER_ID
from reports.models import SuppressionReason
from reports.ops import suppressing

#: Longest listing printed.
MAX_LIST_LIMIT = 1_000_000

_REASON = click.Choice([reason.value for reason in SuppressionReason])


@cli.group()
def suppress() -> None:
    """The suppression list: users who get no monthly report (unsubscribed, bounced, complained)."""


@suppress.command("add")
@click.argument("user_id", type=click.IntRange(min=MIN_USER_ID, max=MAX_USER_ID))
@click.option("--reason", type=_REASON, help="Why the user gets no more reports (required).")
@pass_obj
def add(obj: Obj, user_id: int, reason: str | None) -> None:
    """Suppress USER_ID: not planned from the next walk on, skipped if already planned."""
    if reason is None:
        # Checked here: click's own message for a missing choice spans several lines.
        raise BadInput(f"--reason is required: one of {', '.join(r.value for r in SuppressionReason)}.")
    with obj.session() as session:
        existing = suppressing.suppress(session, user_id, SuppressionReason(reason), now=utcnow(), source="cli")
    if existing is not None:
        click.echo(f"User {user_id} was already suppressed ({existing}); nothing changed.")
        return
    click.echo(f"User {user_id} suppressed ({reason}).")


@suppress.command("remove")
@click.argument("user_id", type=click.IntRange(min=MIN_USER_ID, max=MAX_USER_ID))
@pass_obj
def remove(obj: Obj, user_id: int) -> None:
    """Lift USER_ID's suppression, whatever its reason: the next period mails them again.

    The provider feedback about the user (a false complaint, a bounce that was the provider's fault)
    is dismissed with it: it no longer counts toward soft bounces or the period's rates.
    """
    with obj.session() as session:
        lifted = suppressing.lift(session, user_id, now=utcnow())
    if not lifted.removed:
        click.echo(f"User {user_id} was not suppressed; nothing changed.")
        return
    click.echo(
        f"User {user_id} is no longer suppressed"
        + (f"; {lifted.dismissed} provider feedback event(s) dismissed." if lifted.dismissed else ".")
    )


@suppress.command("list")
@click.option("--reason", type=_REASON, help="Only this reason.")
@click.option("--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@pass_obj
def list_(obj: Obj, reason: str | None, limit: int, as_json: bool) -> None:
    """The suppressed users, lowest id first."""
    with obj.session() as session:
        found = suppressions.find(session, reason=SuppressionReason(reason) if reason else None, limit=limit)
        rows = (
            {
                "user_id": s.user_id,
                "reason": s.reason,
                "created_at": iso_utc(s.created_at),
                "source": s.source,
                "provider": s.provider,
                "event_id": s.event_id,
            }
            for s in found
        )
        echo_listing(rows, as_json=as_json, line=_line, counted="suppressed user(s)")


def _line(row: dict[str, Any]) -> str:
    event = f"  {row['provider']} event {row['event_id']}" if row["provider"] else ""
    return f"{row['user_id']}  {row['reason']:<12}  {row['created_at']}  {row['source'] or ''}{event}"
