"""One user's email for a period as it would be sent now, built and never sent: what ``reports
preview`` writes to files and the console shows in a frame."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from reports import tokens
from reports.content.activity import load_summary
from reports.content.render import RenderedReport, render
from reports.delivery.mail.compose import compose, message_id, recipient
from reports.errors import BadInput
from reports.jobs import is_version_name
from reports.look import ReportLook
from reports.models import PeriodRun, User
from reports.periods import Period
from reports.settings import Settings


@dataclass(frozen=True)
class Preview:
    #: The message's bytes, as they would go on the wire.
    email: bytes
    rendered: RenderedReport


#: Where a preview shown to someone who is not the user points the unsubscribe link: a path the
#: unsubscribe page answers as a link that is not valid.
INERT_UNSUBSCRIBE_PATH = f"{tokens.PATH_PREFIX}preview"


def build(
    session: Session,
    settings: Settings,
    user: User,
    period: Period,
    template_version: str,
    now: datetime,
    *,
    working_link: bool = True,
) -> Preview:
    """The email the pipeline would send ``user`` for ``period`` now, built by the pipeline's own
    read path (activity, render, compose) and nothing else: the one place a change of it lands here.

    ``working_link=False`` puts an inert unsubscribe link in it: the real one is the user's
    credential, which unsubscribes them at one click, and a viewer of the console must not get it."""
    links = tokens.links(settings)
    unsubscribe_url = links.url(user.id) if working_link else f"{links.base_url}{INERT_UNSUBSCRIBE_PATH}"
    rendered = render(
        settings.templates_dir,
        template_version,
        name=user.name,
        summary=load_summary(session, user.id, period),
        look=ReportLook.from_settings(settings),
        locale=user.locale,
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


def check_version(settings: Settings, version: str) -> None:
    """Raise :class:`BadInput` unless ``version`` is a template folder in TEMPLATES_DIR."""
    if not is_version_name(version) or not (settings.templates_dir / version).is_dir():
        raise BadInput(f"Template version {version!r} does not exist in {settings.templates_dir}.")
