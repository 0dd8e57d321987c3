"""``reports feedback list``: the bounces and complaints the mail providers' webhooks reported."""

from __future__ import annotations

import json

import click

from reports.cli.app import Obj, cli, iso_utc, pass_obj, period_option
from reports.feedback import store
from reports.feedback.events import Kind, Provider
from reports.jobs import MAX_USER_ID, MIN_USER_ID

#: Most events one ``list`` prints.
MAX_LIST_LIMIT = 1_000_000


@cli.group()
def feedback() -> None:
    """Provider feedback: bounces, complaints and unsubscribes from the providers' webhooks."""


@feedback.command("list")
@click.option("--provider", type=click.Choice([p.value for p in Provider]), help="Only this provider's events.")
@click.option("--kind", type=click.Choice([k.value for k in Kind]), help="Only this kind.")
@click.option("--period", callback=period_option, help="Only events about this period's email (YYYY-MM).")
@click.option("--user", "user_id", type=click.IntRange(MIN_USER_ID, MAX_USER_ID), help="Only events about this user.")
@click.option("--limit", type=click.IntRange(1, MAX_LIST_LIMIT), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@pass_obj
def list_(
    obj: Obj,
    provider: str | None,
    kind: str | None,
    period: str | None,
    user_id: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """The most recently received events first, one line per user an event matched."""
    with obj.session() as session:
        found = store.find(session, provider=provider, kind=kind, period=period, user_id=user_id, limit=limit)
    rows = [
        {
            "received_at": iso_utc(e.received_at),
            "occurred_at": iso_utc(e.occurred_at),
            "provider": e.provider,
            "kind": e.kind,
            "event_id": e.event_id,
            "user_id": e.user_id,
            "period": e.period,
            "address": e.address,
            "summary": e.summary,
            "dismissed": bool(e.dismissed),
        }
        for e in found
    ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    for row in rows:
        who = f"user {row['user_id']}" if row["user_id"] is not None else "unmatched"
        state = "  dismissed" if row["dismissed"] else ""
        click.echo(
            f"{row['received_at']}  {row['provider']:<8}  {row['kind']:<11}  {who:<12}  {row['period'] or '-':<7}  "
            f"{row['event_id']}  {row['summary']}{state}"
        )
    click.echo(f"{len(rows)} event(s).")
