"""One user's report for one period: read at run time, render, store, claim, send, record.

Three short steps, so no transaction stays open while talking to the mail provider:
1. In one transaction: read the item, the user and their activity; render and store the
   report; take the delivery claim.
2. Hand the email to the mail backend.
3. In one transaction: mark the claim sent and the item delivered.

Every step may run more than once or concurrently (at-least-once delivery); the item's final
states and the delivery claim make repeats send nothing.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage

import sqlalchemy.exc
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reports import delivery, items
from reports.activity import load_summary
from reports.breaker import CircuitBreaker, Permit, State
from reports.clock import utcnow
from reports.errors import CircuitOpen, PermanentError, is_provider_failure
from reports.jobs import ReportJob, SendNowJob
from reports.mail.backend import Mailer
from reports.mail.compose import compose, message_id, recipient
from reports.models import FINAL_STATES, ItemState, PeriodRun, Report, ReportItem, RunState, User
from reports.periods import Period
from reports.render import RenderedReport, render
from reports.settings import Settings
from reports.sql import upsert

logger = logging.getLogger(__name__)

#: Pauses between tries at recording a send in the database, in seconds.
RECORD_SENT_PAUSES_SECONDS = (0.2, 1.0)


class UnknownItem(PermanentError):
    """The message names a (period, user) that the coordinator never recorded."""


class UnknownUser(PermanentError):
    """The message names a user that does not exist."""


class Outcome(enum.StrEnum):
    DELIVERED = "delivered"
    SKIPPED = "skipped"
    #: The period was cancelled: nothing sent, the item left pending.
    CANCELLED = "cancelled"
    #: Another copy of the message had already finished the item.
    ALREADY_DONE = "already_done"


@dataclass(frozen=True)
class Context:
    """What a per-user job needs, built once per worker process."""

    settings: Settings
    sessions: sessionmaker[Session]
    mailer: Mailer
    #: Shared circuit breaker for the mail provider; ``None`` when there is no remote provider.
    breaker: CircuitBreaker | None = None
    clock: Callable[[], datetime] = utcnow


def run(ctx: Context, job: ReportJob) -> Outcome:
    """The monthly email for one (period, user)."""
    return _deliver(ctx, lambda session: _prepare(ctx, session, job))


def send_now(ctx: Context, job: SendNowJob) -> Outcome:
    """A report a person asked for now: sent if it never was, sent again (a new email) if it was.

    The request's own claim makes it one email per request however often the message runs. If
    the monthly email has not gone out, this *is* the monthly email (its claim and Message-ID),
    so the monthly run will not send a second one.
    """
    return _deliver(ctx, lambda session: _prepare_now(ctx, session, job))


def _deliver(ctx: Context, prepare: Callable[[Session], _Prepared | Outcome]) -> Outcome:
    permit = _ask_breaker(ctx)
    with ctx.sessions.begin() as session:
        prepared = prepare(session)
    if not isinstance(prepared, _Prepared):
        return prepared
    _send(ctx, prepared, permit)
    return Outcome.DELIVERED


def _send(ctx: Context, prepared: _Prepared, permit: Permit | None) -> None:
    try:
        ctx.mailer.send(prepared.email, recipient=prepared.address)
    except Exception as error:
        with ctx.sessions.begin() as session:
            for claim in prepared.claims:
                delivery.release(session, claim, now=ctx.clock())
        _tell_breaker_failure(ctx, permit, error)
        raise
    if permit is not None and permit.probe:
        ctx.breaker.record_success()  # type: ignore[union-attr]
    _record_sent(ctx, prepared.claims)


def _ask_breaker(ctx: Context) -> Permit | None:
    if ctx.breaker is None:
        return None
    permit = ctx.breaker.allow(_millis(ctx.clock()))
    if not permit.allowed:
        raise CircuitOpen(permit.wait_ms / 1000)
    return permit


def _tell_breaker_failure(ctx: Context, permit: Permit | None, error: Exception) -> None:
    """Count a provider failure; once the breaker is open, wait out the cool-down instead of retrying."""
    if ctx.breaker is None or permit is None:
        return
    if not is_provider_failure(error):
        if permit.probe:
            ctx.breaker.record_success()  # the provider answered: it is up
        return
    state = ctx.breaker.record_failure(_millis(ctx.clock()), token=str(uuid.uuid4()))
    if state is State.OPEN:
        raise CircuitOpen(ctx.breaker.cooldown_ms / 1000) from error


def _millis(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1000)


def _record_sent(ctx: Context, claims: list[delivery.Claim]) -> None:
    """Record a send that happened; tried a few times, since failing here is what re-sends an email."""
    for pause in (*RECORD_SENT_PAUSES_SECONDS, None):
        try:
            with ctx.sessions.begin() as session:
                now = ctx.clock()
                for claim in claims:
                    if claim.request_id is None:
                        # Item first, then delivery: the lock order of _prepare, so copies cannot deadlock.
                        items.finish(session, claim.period, claim.user_id, ItemState.DELIVERED, now=now)
                    if not delivery.complete(session, claim, now=now):
                        logger.warning(
                            "Delivery claim was taken over while sending; a duplicate may follow.",
                            extra={"period": str(claim.period), "user_id": claim.user_id},
                        )
            return
        except sqlalchemy.exc.OperationalError:
            if pause is None:
                raise
            time.sleep(pause)


@dataclass(frozen=True)
class _Prepared:
    claims: list[delivery.Claim]
    email: EmailMessage
    address: str


def _prepare(ctx: Context, session: Session, job: ReportJob) -> _Prepared | Outcome:
    now = ctx.clock()
    # Locking the item serializes copies of this job here, before they race for the claim.
    item = session.get(ReportItem, (str(job.period), job.user_id), with_for_update=True)
    if item is None:
        raise UnknownItem(f"No report item for period {job.period}, user {job.user_id}.")
    if item.state in FINAL_STATES:
        return Outcome.ALREADY_DONE
    run_state = session.scalar(select(PeriodRun.state).where(PeriodRun.period == str(job.period)))
    if run_state == RunState.CANCELLED:
        # The item stays pending; `trigger` re-enqueues it when the period is resumed.
        return Outcome.CANCELLED
    item.attempts += 1
    item.updated_at = now

    user = session.get(User, job.user_id)
    if user is None or not user.active:
        items.finish(session, job.period, job.user_id, ItemState.SKIPPED, now=now)
        return Outcome.SKIPPED

    to, rendered = _render_and_store(ctx, session, user, job.period, job.template_version, now)
    stable_id = message_id(job.period, user.id, ctx.settings.mail_domain)
    claim = delivery.take(session, job.period, user.id, message_id=stable_id,
                          lease_seconds=ctx.settings.claim_lease_seconds, now=now)
    if claim is None:
        # The email already went out; make the item say so.
        items.finish(session, job.period, job.user_id, ItemState.DELIVERED, now=now)
        return Outcome.ALREADY_DONE
    email = compose(rendered, to=to, mail_from=ctx.settings.mail_from, period=job.period, user_id=user.id,
                    date=now, message_id=stable_id)
    return _Prepared(claims=[claim], email=email, address=to.addr_spec)


def _prepare_now(ctx: Context, session: Session, job: SendNowJob) -> _Prepared | Outcome:
    now = ctx.clock()
    # Lock the monthly item (if the period has one) first, as _prepare does.
    session.get(ReportItem, (str(job.period), job.user_id), with_for_update=True)
    user = session.get(User, job.user_id)
    if user is None:
        raise UnknownUser(f"No user with id {job.user_id}.")
    to, rendered = _render_and_store(ctx, session, user, job.period, job.template_version, now)
    request_id = message_id(job.period, user.id, ctx.settings.mail_domain, request_id=job.request_id)
    lease = ctx.settings.claim_lease_seconds
    request = delivery.take_request(session, job.request_id, job.period, user.id, message_id=request_id,
                                    lease_seconds=lease, now=now)
    if request is None:
        return Outcome.ALREADY_DONE
    claims, chosen_id = [request], request_id
    if not delivery.is_sent(session, job.period, user.id):
        monthly_id = message_id(job.period, user.id, ctx.settings.mail_domain)
        monthly = delivery.take(session, job.period, user.id, message_id=monthly_id, lease_seconds=lease, now=now)
        if monthly is not None:
            claims, chosen_id = [monthly, request], monthly_id
    email = compose(rendered, to=to, mail_from=ctx.settings.mail_from, period=job.period, user_id=user.id,
                    date=now, message_id=chosen_id)
    return _Prepared(claims=claims, email=email, address=to.addr_spec)


def _render_and_store(
    ctx: Context, session: Session, user: User, period: Period, template_version: str, now: datetime
) -> tuple[Address, RenderedReport]:
    """Read the user's activity, render the report, and store it as it is about to be sent."""
    to = recipient(user.email, user.name)
    rendered = render(ctx.settings.templates_dir, template_version, name=user.name,
                      summary=load_summary(session, user.id, period))
    session.execute(upsert(session, Report.__table__, {
        "period": str(period), "user_id": user.id, "template_version": template_version,
        "subject": rendered.subject, "body_text": rendered.text, "body_html": rendered.html, "rendered_at": now,
    }, key=["period", "user_id"]))
    return to, rendered
