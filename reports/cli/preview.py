"""``reports preview``: render real users' reports as they would be sent now, into files, and
send, claim and record nothing. The way to check a new template before the first of the month.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from reports.cli.app import Obj, cli, pass_obj, period_argument
from reports.clock import utcnow
from reports.content.activity import load_summary
from reports.content.render import RenderedReport, render
from reports.delivery.mail.compose import compose, message_id, recipient
from reports.errors import BadInput, PermanentError
from reports.jobs import MAX_USER_ID, MIN_USER_ID, is_version_name
from reports.look import ReportLook
from reports.models import PeriodRun, User
from reports.periods import Period
from reports.settings import Settings
from reports.unsubscribe import tokens

#: Users one preview renders at most: it is a look at a template, not a run.
MAX_SAMPLE = 1_000

#: Users rendered when neither ``--user`` nor ``--sample`` is given.
DEFAULT_SAMPLE = 5


@dataclass(frozen=True)
class Preview:
    #: The message's bytes, as they would go on the wire.
    email: bytes
    rendered: RenderedReport


def build(
    session: Session, settings: Settings, user: User, period: Period, template_version: str, now: datetime
) -> Preview:
    """The email the pipeline would send ``user`` for ``period`` now, built by the pipeline's own
    read path (activity, render, compose) and nothing else: the one place a change of it lands here."""
    unsubscribe_url = tokens.links(settings).url(user.id)
    rendered = render(
        settings.templates_dir,
        template_version,
        name=user.name,
        summary=load_summary(session, user.id, period),
        look=ReportLook.from_settings(settings),
        unsubscribe_url=unsubscribe_url,
    )
    email = compose(
        rendered,
        to=recipient(user.email, user.name),
        mail_from=settings.mail_from,
        period=period,
        user_id=user.id,
        date=now,
        message_id=message_id(period, user.id, settings.mail_domain),
        unsubscribe_url=unsubscribe_url,
    )
    return Preview(email=email, rendered=rendered)


def template_version_for(session: Session, settings: Settings, period: Period, named: str | None) -> str:
    """The version named, else the one the period's run pinned, else the one a trigger would pin now."""
    if named is not None:
        return named
    pinned = session.scalar(select(PeriodRun.template_version).where(PeriodRun.period == str(period)))
    return pinned or settings.template_version


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


def _check_version(settings: Settings, version: str) -> None:
    if not is_version_name(version) or not (settings.templates_dir / version).is_dir():
        raise BadInput(f"Template version {version!r} does not exist in {settings.templates_dir}.")


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
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Folder to write the files to.")
@pass_obj
def preview(
    obj: Obj, period: Period, user_ids: tuple[int, ...], sample: int | None, template_version: str | None, out: Path
) -> None:
    """Render PERIOD's reports as they would be sent now into OUT (an .eml and an .html per user).

    Sends, claims and records nothing.
    """
    if user_ids and sample is not None:
        raise BadInput("Choose --user or --sample, not both.")
    settings = obj.settings
    if template_version is not None:
        _check_version(settings, template_version)
    now = utcnow()
    # A session never committed: whatever happens, nothing is written to the database.
    with obj.sessions()() as session:
        version = template_version_for(session, settings, period, template_version)
        _check_version(settings, version)
        users = _users(session, user_ids, sample)
        session.expunge_all()
        session.rollback()
        _writable(out)
        for user in users:
            try:
                built = build(session, settings, user, period, version, now)
            except PermanentError as e:
                click.echo(f"user {user.id}: would be a dead letter: {e}", err=True)
                continue
            finally:
                # One transaction per user: on SQLite every transaction holds the write lock
                # (BEGIN IMMEDIATE), which a running period's workers must not wait behind.
                session.rollback()
            stem = out / f"{period}-{user.id}"
            stem.with_suffix(".eml").write_bytes(built.email)
            stem.with_suffix(".html").write_text(built.rendered.html, encoding="utf-8")
            click.echo(stem.with_suffix(".eml"))
            click.echo(stem.with_suffix(".html"))
