"""``reports preview``: render real users' reports as they would be sent now, into files, and
send, claim and record nothing. The way to check a new template before the first of the month.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from reports.cli.app import Obj, cli, non_empty, pass_obj, period_argument
from reports.clock import utcnow
from reports.content.render import missing_catalogs_warning
from reports.errors import BadInput, PermanentError
from reports.jobs import MAX_USER_ID, MIN_USER_ID
from reports.models import User
from reports.ops import preview as preview_build
from reports.periods import Period

#: Users one preview renders at most: it is a look at a template, not a run.
MAX_SAMPLE = 1_000

#: Users rendered when neither ``--user`` nor ``--sample`` is given.
DEFAULT_SAMPLE = 5


def _users(session: Session, user_ids: tuple[int, ...], sample: int | None) -> list[User]:
    if not user_ids:
        # The lowest ids: the same users every time, so two previews of two templates compare.
        return list(
            session.scalars(select(User).where(User.active.is_(True)).order_by(User.id).limit(sample or DEFAULT_SAMPLE))
        )
    found = {user.id: user for user in session.scalars(select(User).where(User.id.in_(user_ids)))}
    if missing := sorted(set(user_ids) - found.keys()):
        raise BadInput(f"No user with id {', '.join(map(str, missing))}.")
    if inactive := sorted(i for i in set(user_ids) if not found[i].active):
        raise BadInput(f"User {', '.join(map(str, inactive))} is inactive and would be sent no report.")
    return [found[i] for i in dict.fromkeys(user_ids)]


def _writable(out: Path) -> Path:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"Cannot use {out} as the output folder: {e.strerror or e}.") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise BadInput(f"Cannot write to the output folder {out}.")
    return out


@cli.command()
@period_argument(closed=False)
@click.option(
    "--user",
    "user_ids",
    type=click.IntRange(MIN_USER_ID, MAX_USER_ID),
    multiple=True,
    help="A user to render (repeatable).",
)
@click.option(
    "--sample",
    type=click.IntRange(1, MAX_SAMPLE),
    help=f"Render this many active users, lowest ids first [default: {DEFAULT_SAMPLE}].",
)
@click.option("--template-version", help="Render with this version, not the one the period pins.")
@click.option("--out", "out", callback=non_empty, required=True, help="Folder to write the files to.")
@pass_obj
def preview(
    obj: Obj, period: Period, user_ids: tuple[int, ...], sample: int | None, template_version: str | None, out: str
) -> None:
    """Render PERIOD's reports as they would be sent now into OUT (an .eml and an .html per user).

    Sends, claims and records nothing.
    """
    if user_ids and sample is not None:
        raise BadInput("Choose --user or --sample, not both.")
    settings = obj.settings
    if template_version is not None:
        preview_build.check_version(settings, template_version)
    now = utcnow()
    # A session never committed: whatever happens, nothing is written to the database.
    with obj.sessions()() as session:
        version = preview_build.template_version_for(session, settings, period, template_version)
        preview_build.check_version(settings, version)
        if (no_catalog := missing_catalogs_warning(settings.templates_dir, version)) is not None:
            click.echo(f"warning: {no_catalog}", err=True)
        users = _users(session, user_ids, sample)
        session.expunge_all()
        session.rollback()
        folder = _writable(Path(out))
        for user in users:
            try:
                built = preview_build.build(session, settings, user, period, version, now)
            except PermanentError as e:
                click.echo(f"user {user.id}: would be a dead letter: {e}", err=True)
                continue
            finally:
                # One transaction per user: on SQLite every transaction holds the write lock
                # (BEGIN IMMEDIATE), which a running period's workers must not wait behind.
                session.rollback()
            stem = folder / f"{period}-{user.id}"
            stem.with_suffix(".eml").write_bytes(built.email)
            stem.with_suffix(".html").write_text(built.rendered.html, encoding="utf-8")
            click.echo(stem.with_suffix(".eml"))
            click.echo(stem.with_suffix(".html"))
