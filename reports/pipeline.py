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
from email.message import EmailMessage

import sqlalchemy.exc
from sqlalchemy.orm import Session, sessionmaker

from reports import delivery, items
from reports.activity import load_summary
from reports.breaker import CircuitBreaker, Permit, State
from reports.clock import utcnow
from reports.errors import CircuitOpen, PermanentError, is_provider_failure
from reports.jobs import ReportJob
from reports.mail.backend import Mailer
from reports.mail.compose import compose, message_id, recipient
from reports.models import FINAL_STATES, ItemState, Report, ReportItem, User
from reports.render import render
from reports.settings import Settings
from reports.sql import upsert

logger = logging.getLogger(__name__)

#: Pauses between tries at recording a send in the database, in seconds.
RECORD_SENT_PAUSES_SECONDS = (0.2, 1.0)


class UnknownItem(PermanentError):
    """The message names a (period, user) that the coordinator never recorded."""


class Outcome(enum.StrEnum):
    DELIVERED = "delivered"
    SKIPPED = "skipped"
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
    permit = _ask_breaker(ctx)
    with ctx.sessions.begin() as session:
        prepared = _prepare(ctx, session, job)
    if not isinstance(prepared, _Prepared):
        return prepared

    try:
        ctx.mailer.send(prepared.email, recipient=prepared.address)
    except Exception as error:
        with ctx.sessions.begin() as session:
            delivery.release(session, prepared.claim, now=ctx.clock())
        _tell_breaker_failure(ctx, permit, error)
        raise

    if permit is not None and permit.probe:
        ctx.breaker.record_success()  # type: ignore[union-attr]
    _record_sent(ctx, job, prepared.claim)
    return Outcome.DELIVERED


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


def _record_sent(ctx: Context, job: ReportJob, claim: delivery.Claim) -> None:
    """Record a send that happened; tried a few times, since failing here is what re-sends an email."""
    for pause in (*RECORD_SENT_PAUSES_SECONDS, None):
        try:
            with ctx.sessions.begin() as session:
                now = ctx.clock()
                # Item first, then delivery: the same lock order as _prepare, so copies cannot deadlock.
                items.finish(session, job.period, job.user_id, ItemState.DELIVERED, now=now)
                if not delivery.complete(session, claim, now=now):
                    logger.warning(
                        "Delivery claim was taken over while sending; a duplicate may follow.",
                        extra={"period": str(job.period), "user_id": job.user_id},
                    )
            return
        except sqlalchemy.exc.OperationalError:
            if pause is None:
                raise
            time.sleep(pause)


@dataclass(frozen=True)
class _Prepared:
    claim: delivery.Claim
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
    item.attempts += 1
    item.updated_at = now

    user = session.get(User, job.user_id)
    if user is None or not user.active:
        items.finish(session, job.period, job.user_id, ItemState.SKIPPED, now=now)
        return Outcome.SKIPPED

    to = recipient(user.email, user.name)
    rendered = render(ctx.settings.templates_dir, job.template_version, name=user.name,
                      summary=load_summary(session, user.id, job.period))
    session.execute(upsert(session, Report.__table__, {
        "period": str(job.period), "user_id": user.id, "template_version": job.template_version,
        "subject": rendered.subject, "body_text": rendered.text, "body_html": rendered.html, "rendered_at": now,
    }, key=["period", "user_id"]))

    stable_id = message_id(job.period, user.id, ctx.settings.mail_domain)
    claim = delivery.take(session, job.period, user.id, message_id=stable_id,
                          lease_seconds=ctx.settings.claim_lease_seconds, now=now)
    if claim is None:
        # The email already went out; make the item say so.
        items.finish(session, job.period, job.user_id, ItemState.DELIVERED, now=now)
        return Outcome.ALREADY_DONE
    email = compose(rendered, to=to, mail_from=ctx.settings.mail_from, period=job.period,
                    user_id=user.id, domain=ctx.settings.mail_domain, date=now)
    return _Prepared(claim=claim, email=email, address=to.addr_spec)
