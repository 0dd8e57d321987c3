"""One user's report for one period: read at run time, render, claim, send, record.

Three short steps, so no transaction stays open while rendering or talking to the mail provider:
1. One transaction (the store's read and claim): read the item, the user and their activity,
   and take the delivery claim; then, outside it, render.
2. Wait for a slot of the send rate, ask the breaker and, last, check that the claim's lease
   outlasts the whole send; hand the email to the mail backend.
3. One transaction: mark the claim sent and the item delivered, tried until the lease is nearly
   spent: only a crash in between can make a later copy send again.

Why each step is safe to repeat: docs/explanation/guarantees.md, "The claim".
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import Address

import redis
import sqlalchemy.exc
from sqlalchemy.orm import Session, sessionmaker

from reports import items, suppressions, tokens
from reports.clock import utcnow
from reports.content.activity import load_summary
from reports.content.render import RenderedReport, render
from reports.delivery import brake, claims, send_rate
from reports.delivery.brake import Brake
from reports.delivery.breaker import CircuitBreaker, Permit, State
from reports.delivery.mail.backend import Mailer
from reports.delivery.mail.compose import compose, message_id, recipient
from reports.delivery.send_rate import SendRate, pace
from reports.delivery.store import Inputs, ReadAndClaim, Store, StoredReport, Transaction, keep_report, open_store
from reports.errors import (
    ClaimHeld,
    MailDeferred,
    MailRejected,
    PermanentError,
    RateLimited,
    SendUnconfirmed,
    is_provider_failure,
)
from reports.jobs import ReportJob, SendNowJob
from reports.look import ReportLook
from reports.models import FINAL_STATES, ItemState, PeriodRun, ReportItem, RunState, SuppressionReason, User
from reports.outcome import Outcome
from reports.periods import Period
from reports.settings import CLAIM_LEASE_MARGIN_SECONDS, Settings
from reports.sql import Executor
from reports.tokens import Links

logger = logging.getLogger(__name__)

#: Longest pause between tries at recording a send in the database, in seconds.
RECORD_SENT_PAUSE_CAP_SECONDS = 1.0

#: Of the lease's margin over a whole send (CLAIM_LEASE_MARGIN_SECONDS), what must still be left
#: when the send starts, to record it; the rest absorbs the prepare step's commit.
RECORD_TIME_SECONDS = CLAIM_LEASE_MARGIN_SECONDS / 2

#: Longest a send waits in all for its slot of the send rate before it is deferred, in seconds.
PACE_PATIENCE_SECONDS = 5.0

#: How soon a message whose item may still be on its way from the coordinator looks again, in seconds.
ITEM_NOT_YET_RECORDED_RETRY_SECONDS = 2.0


class UnknownItem(PermanentError):
    """The message names a (period, user) that the coordinator never recorded."""


class UnknownUser(PermanentError):
    """The message names a user that does not exist."""


@dataclass(frozen=True)
class Context:
    """What a per-user job needs, built once per worker process."""

    settings: Settings
    sessions: sessionmaker[Session]
    mailer: Mailer
    #: Shared circuit breaker for the mail provider; ``None`` when there is no remote provider.
    breaker: CircuitBreaker | None = None
    #: The fleet's send rate; ``None`` when SEND_RATE_PER_SECOND is unset and there is no
    #: provider's pace to follow.
    send_rate: SendRate | None = None
    #: The brake on a month-wide rejection; ``None``: none (no remote provider).
    brake: Brake | None = None
    #: Branding, locale and currency of the report, built once from the settings.
    look: ReportLook | None = None
    clock: Callable[[], datetime] = utcnow
    #: Every user's unsubscribe link; ``None`` builds it from the settings, once per context.
    unsubscribe: Links | None = None
    #: The per-report statements on this database; left out, the adapter for ``sessions``.
    store: Store = None  # type: ignore[assignment]  # filled in by __post_init__

    def __post_init__(self) -> None:
        if self.unsubscribe is None:
            object.__setattr__(self, "unsubscribe", tokens.links(self.settings))
        if self.store is None:
            object.__setattr__(self, "store", open_store(self.sessions))

    def unsubscribe_url(self, user_id: int) -> str:
        return self.unsubscribe.url(user_id)  # type: ignore[union-attr]


def run(ctx: Context, job: ReportJob) -> Outcome:
    """The monthly email for one (period, user)."""
    with ctx.store.transactions() as transaction:
        return _deliver(ctx, lambda: _prepare(ctx, transaction, job), transaction)


def send_now(ctx: Context, job: SendNowJob) -> Outcome:
    """A report a person asked for now: sent if it never was, sent again (a new email) if it was.

    The request's own claim makes it one email per request however often the message runs. If
    the monthly email has not gone out and still may (:func:`claims.monthly_may_follow`), this
    *is* the monthly email (its claim and Message-ID), so the monthly run will not send a second
    one; otherwise it has a Message-ID of its own.
    """

    def prepare() -> _Prepared | Outcome:
        with ctx.sessions.begin() as session:
            return _prepare_now(ctx, session, job)

    return _deliver(ctx, prepare, ctx.sessions.begin)


def _deliver(ctx: Context, prepare: Callable[[], _Prepared | Outcome], transaction: Transaction) -> Outcome:
    try:
        prepared = prepare()
    except ClaimHeld as held:
        return Outcome.deferred(held.retry_after_seconds, "claim held by another copy")
    if not isinstance(prepared, _Prepared):
        return prepared
    # Asked only now, so a message that turns out done, skipped or cancelled never holds the
    # half-open probe's one slot for the probe timeout.
    try:
        go = _may_send(ctx, prepared)
    except redis.RedisError:
        _release(ctx, prepared.claims, transaction, report=prepared.report)
        raise
    if isinstance(go, Outcome):
        _release(ctx, prepared.claims, transaction, report=prepared.report)
        return go
    permit, slot = go
    outcome = _send(ctx, prepared, permit, transaction)
    if slot is not None and slot.adapting and outcome is Outcome.DELIVERED:
        _speed_up(ctx, slot)
    return outcome


def _may_send(ctx: Context, prepared: _Prepared) -> tuple[Permit | None, send_rate.Slot | None] | Outcome:
    """The breaker's permit (``None``: no breaker) and the send rate's slot (``None``: no limiter)
    when the send may go now; the deferral otherwise."""
    # First: a sleep for a slot must not hold the probe's slot.
    slot = pace(
        ctx.send_rate,
        _millis(ctx.clock()),
        # Whatever the lease leaves beyond a whole send and its record, up to a few seconds: a
        # worker asked to stop waits for its running messages.
        patience_ms=1000
        * min(prepared.lease_left() - ctx.settings.smtp_timeout_seconds - RECORD_TIME_SECONDS, PACE_PATIENCE_SECONDS),
        sleep=time.sleep,
    )
    if isinstance(slot, Outcome):
        return slot
    permit = _ask_breaker(ctx)
    if isinstance(permit, Outcome):
        return permit
    # Last, after every call that can block (a Redis that stalls holds the breaker's call for
    # as long as it stalls): only the send itself, bounded by the SMTP deadline, comes after.
    if prepared.lease_left() < ctx.settings.smtp_timeout_seconds + RECORD_TIME_SECONDS:
        _give_back(ctx, permit)
        return Outcome.deferred(0.0, "too little of the claim's lease left for a whole send")
    return permit, slot


def _send(
    ctx: Context,
    prepared: _Prepared,
    permit: Permit | None,
    transaction: Transaction,
) -> Outcome:
    try:
        ctx.mailer.send(prepared.email, recipient=prepared.address)
    except Exception as error:
        bounced = error if isinstance(error, MailRejected) and error.recipient else None
        # The provider may have an unconfirmed email: its claim keeps the lease, so no copy sends
        # it again before the lease ends (docs/explanation/duplicate-window.md).
        may_have_gone = isinstance(error, SendUnconfirmed)
        _release(
            ctx, prepared.claims, transaction, report=prepared.report, bounced=bounced, end_leases=not may_have_gone
        )
        if _opens_breaker(ctx, permit, error):
            # The provider is down: wait out the cool-down instead of spending a retry.
            return Outcome.deferred(ctx.breaker.cooldown_ms / 1000, "mail breaker opened")  # type: ignore[union-attr]
        if isinstance(error, RateLimited):
            if _refused_too_often(ctx, prepared, error):
                raise MailDeferred(error.code, error.reply) from error
            # About the fleet's pace, not this message: slower for everyone, and this one later.
            _slow_down(ctx, error)
            return Outcome.deferred(error.retry_after_seconds, f"the provider asked for a slower pace ({error})")
        if isinstance(error, MailRejected) and not error.about_address:
            after_trip = _brake(ctx, prepared, error)
            if after_trip is not None:
                return after_trip
        raise
    _record_sent(ctx, prepared, transaction)
    if permit is not None and permit.probe:
        try:
            ctx.breaker.record_success()  # type: ignore[union-attr]
        except redis.RedisError:
            # The send is recorded; the probe's slot frees itself after the probe timeout.
            logger.warning("Could not tell the breaker its probe succeeded: Redis unreachable.")
    return Outcome.DELIVERED


def _release(
    ctx: Context,
    held: list[claims.Claim],
    transaction: Transaction,
    *,
    report: StoredReport | None = None,
    bounced: MailRejected | None = None,
    end_leases: bool = True,
) -> None:
    """Keep the report that was not sent (if it was rendered), and end the claims' leases early
    (with ``end_leases``), so the next attempt need not wait them out; on a hard bounce also put
    the user on the suppression list, so no later month mails a refused address."""
    try:
        with transaction() as db:
            first = held[0]
            if report is not None:
                keep_report(db, first.period, first.user_id, report)
            if end_leases:
                for claim in held:
                    claims.release(db, claim)
            if bounced is not None:
                suppressions.add(
                    db, first.user_id, SuppressionReason.BOUNCED, now=ctx.clock(), source=f"smtp {bounced.code}"
                )
    except sqlalchemy.exc.SQLAlchemyError:
        logger.warning("Could not release a delivery claim (or record a bounce); the claim ends with its lease.")


def _ask_breaker(ctx: Context) -> Permit | None | Outcome:
    if ctx.breaker is None:
        return None
    permit = ctx.breaker.allow(_millis(ctx.clock()))
    if not permit.allowed:
        return Outcome.deferred(permit.wait_ms / 1000, "mail breaker open")
    return permit


def _give_back(ctx: Context, permit: Permit | None) -> None:
    """A half-open probe that will not send hands its slot back, so the next send probes at once
    instead of every send waiting out the probe timeout."""
    if permit is None:
        return
    try:
        ctx.breaker.give_back(permit, _millis(ctx.clock()))  # type: ignore[union-attr]  # a permit comes from it
    except redis.RedisError:
        logger.warning(
            "Could not give the breaker's probe back: Redis unreachable; its slot ends with the probe timeout."
        )


def _slow_down(ctx: Context, refused: RateLimited) -> None:
    """The provider asked for a slower pace: cut the fleet's rate (once per overload)."""
    if ctx.send_rate is None:
        return
    try:
        cut = ctx.send_rate.slow_down(_millis(ctx.clock()))
    except redis.RedisError:
        logger.warning("Could not lower the send rate after a refusal about the pace: Redis unreachable.")
        return
    if cut is not None:
        logger.info(
            "The provider refused a send for the pace (SMTP %d): the fleet's send rate is now %.2f/s.",
            refused.code,
            cut.per_second,
        )


def _refused_too_often(ctx: Context, prepared: _Prepared, refused: RateLimited) -> bool:
    """Whether this email has been refused for the pace more often than a pace the whole fleet
    meets would refuse it (:data:`~reports.delivery.send_rate.PACE_REFUSALS_PER_EMAIL`): then the
    refusal is about this email, an ordinary 4xx that spends a retry, and the rate is not cut."""
    if ctx.send_rate is None:
        return False
    # A send-now's own request, whether or not it also took the monthly claim this time: the same
    # key at every attempt.
    claim = next((c for c in prepared.claims if c.request_id is not None), prepared.claims[0])
    email = f"{claim.period}:{claim.user_id}:{claim.request_id or 'monthly'}"
    try:
        refusals = ctx.send_rate.refused_for_pace(email)
    except redis.RedisError:
        logger.warning("Could not count a refusal about the pace: Redis unreachable; taken as the pace.")
        return False
    if refusals <= send_rate.PACE_REFUSALS_PER_EMAIL:
        return False
    logger.info(
        "The provider refused user %d's email for %s for the pace %d times (SMTP %d): retried as its own "
        "refusal, the fleet's send rate left as it is.",
        claim.user_id,
        claim.period,
        refusals,
        refused.code,
        extra={"period": str(claim.period), "user_id": claim.user_id},
    )
    return True


def _speed_up(ctx: Context, slot: send_rate.Slot) -> None:
    try:
        ctx.send_rate.sped(slot.at_ms)  # type: ignore[union-attr]  # a slot comes from a limiter
    except redis.RedisError:
        logger.warning("Could not raise the send rate after a send: Redis unreachable.")


def _brake(ctx: Context, prepared: _Prepared, error: MailRejected) -> Outcome | None:
    """Count a monthly email refused for what would refuse every user; past the threshold, pause
    the period (its items stay pending) and raise the alert, once per trip. A refusal after the
    trip is the month's, not the user's: its deferral, for as long as the trip holds."""
    first = prepared.claims[0]
    if ctx.brake is None or first.request_id is not None:
        return None
    try:
        tripped = ctx.brake.note(first.period, first.user_id, str(error), now_ms=_millis(ctx.clock()))
    except redis.RedisError:
        logger.warning("Could not count a refusal for the brake: Redis unreachable.")
        return None
    if tripped is None:
        return None
    if tripped.holds_for_seconds is not None:
        return Outcome.deferred(tripped.holds_for_seconds, f"the brake paused period {first.period}")
    try:
        with ctx.sessions.begin() as session:
            paused = brake.pause(session, first.period, now=ctx.clock())
    except sqlalchemy.exc.SQLAlchemyError:
        logger.warning("The brake could not pause period %s: database unreachable.", first.period)
        return None
    if not paused:
        return None  # cancelled already, by an operator
    logger.error(
        "Period %s paused: %d different users refused within %gs for a reason not about their address "
        "(last: %s). Fix the cause, then `reports trigger %s` resumes it and `reports dlq replay` sends the "
        "dead letters.",
        first.period,
        tripped.failures,
        tripped.window_seconds,
        tripped.reply,
        first.period,
        extra={"period": str(first.period), "failures": tripped.failures},
    )
    if ctx.brake.alert is not None:
        ctx.brake.alert(tripped)
    return None


def _opens_breaker(ctx: Context, permit: Permit | None, error: Exception) -> bool:
    """Count a provider failure; whether the breaker is open now."""
    if ctx.breaker is None or permit is None:
        return False
    if not is_provider_failure(error):
        if permit.probe:
            ctx.breaker.record_success()  # the provider answered: it is up
        return False
    return ctx.breaker.record_failure(_millis(ctx.clock()), token=str(uuid.uuid4())) is State.OPEN


def _millis(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1000)


def _record_sent(ctx: Context, prepared: _Prepared, transaction: Transaction) -> None:
    """Record a send that happened, trying until the claim's lease is nearly spent: failing here
    is what lets a later copy send the email again."""
    pause = 0.05
    while True:
        try:
            with transaction() as db:
                now = ctx.clock()
                for claim in prepared.claims:
                    if claim.request_id is None:
                        recorded = ctx.store.record_sent(db, claim, prepared.report, now=now)
                    else:
                        recorded = claims.complete(db, claim, now=now)
                    if not recorded:
                        logger.warning(
                            "Delivery claim was taken over while sending; a duplicate may follow.",
                            extra={"period": str(claim.period), "user_id": claim.user_id},
                        )
            return
        except sqlalchemy.exc.DBAPIError as error:
            if prepared.lease_left() < pause:
                logger.error(
                    "Could not record a send before its claim's lease ran out (%s); a later copy may send it again.",
                    type(error.orig).__name__,
                    extra={"user_id": prepared.claims[0].user_id},
                )
                raise
            time.sleep(pause)
            pause = min(pause * 2, RECORD_SENT_PAUSE_CAP_SECONDS)


@dataclass(frozen=True)
class _Prepared:
    claims: list[claims.Claim]
    #: The message's bytes, as they go on the wire.
    email: bytes
    address: str
    #: When the claims' leases end, on this process's monotonic clock (see :func:`_lease_ends`).
    lease_ends: float
    #: What is stored in ``reports`` once the send is recorded (or has failed).
    report: StoredReport

    def lease_left(self) -> float:
        return self.lease_ends - time.monotonic()


def _lease_ends(ctx: Context) -> float:
    """When a lease about to be taken ends, on this process's monotonic clock.

    The database stores the lease on its own clock, from when it takes the claim until
    ``claim_lease_seconds`` later; read before the claim is taken, this ends no later than that
    (clocks that disagree on the time still agree on how long a second is). The wall clock plays
    no part: a worker whose clock is off sees the same lease as every other.
    """
    return time.monotonic() + ctx.settings.claim_lease_seconds


def _prepare(ctx: Context, transaction: Transaction, job: ReportJob) -> _Prepared | Outcome:
    stable_id = message_id(job.period, job.user_id, ctx.settings.mail_domain)
    now, lease_ends = ctx.clock(), _lease_ends(ctx)
    with transaction() as db:
        inputs = _read_and_claim(ctx, db, job, message_id=stable_id, now=now)
    if isinstance(inputs, Outcome):
        return inputs
    claim = inputs.claim
    assert claim is not None and inputs.email is not None  # a mailable report has an address
    try:
        to = recipient(inputs.email, inputs.name)
        unsubscribe_url = ctx.unsubscribe_url(job.user_id)
        rendered = render(
            ctx.settings.templates_dir,
            job.template_version,
            name=inputs.name,
            summary=inputs.summary,
            look=ctx.look,
            locale=inputs.locale,
            unsubscribe_url=unsubscribe_url,
        )
        email = compose(
            rendered,
            to=to,
            mail_from=ctx.settings.mail_from,
            period=job.period,
            user_id=job.user_id,
            date=now,
            message_id=stable_id,
            unsubscribe_url=unsubscribe_url,
        )
    except Exception:
        # The claim is taken for good by now: end its lease, so that a retry need not wait it out.
        _release(ctx, [claim], transaction)
        raise
    return _Prepared(
        claims=[claim],
        email=email,
        address=to.addr_spec,
        lease_ends=lease_ends + inputs.lock_wait_seconds,
        report=StoredReport(job.template_version, rendered, now),
    )


def _read_and_claim(ctx: Context, db: Executor, job: ReportJob, *, message_id: str, now: datetime) -> Inputs | Outcome:
    """The report's inputs with the monthly email's claim; the outcome instead when there is
    nothing to send (the item is settled here, in the same transaction)."""
    # Reading locks the item: copies of this job serialize here, before they race for the claim.
    inputs = ctx.store.read_and_claim(
        db,
        ReadAndClaim(
            job.period,
            job.user_id,
            message_id=message_id,
            lease_seconds=ctx.settings.claim_lease_seconds,
            now=now,
            empty_month=ctx.settings.report_empty_month,
        ),
    )
    if inputs.item_state is None:
        return _missing_item(inputs, job)
    if inputs.item_state in FINAL_STATES:
        return Outcome.ALREADY_DONE
    if inputs.run_state == RunState.CANCELLED:
        # The item stays pending; `trigger` re-enqueues it when the period is resumed.
        return Outcome.CANCELLED
    # Suppressed after the coordinator planned the user (or before, by an older release): skipped.
    if not inputs.mailable:
        items.touch(db, job.period, job.user_id, now=now)
        items.finish(db, job.period, job.user_id, ItemState.SKIPPED, now=now)
        return Outcome.SKIPPED
    if inputs.claim is None:
        # The email already went out; make the item say so.
        items.finish(db, job.period, job.user_id, ItemState.DELIVERED, now=now)
        return Outcome.ALREADY_DONE
    return inputs


def _missing_item(inputs: Inputs, job: ReportJob) -> Outcome:
    """For a message whose item is not there: defer while the walk may still record it."""
    walk_to_come = inputs.cursor is None or inputs.cursor < job.user_id
    if inputs.run_state is not None and not inputs.planned and walk_to_come:
        return Outcome.deferred(ITEM_NOT_YET_RECORDED_RETRY_SECONDS, "item not yet recorded by the walk")
    raise UnknownItem(f"No report item for period {job.period}, user {job.user_id}.")


def _prepare_now(ctx: Context, session: Session, job: SendNowJob) -> _Prepared | Outcome:
    # Lock the monthly item (if the period has one) first, as the monthly message's read does.
    item = session.get(ReportItem, (str(job.period), job.user_id), with_for_update=True)
    run = session.get(PeriodRun, str(job.period))
    now = ctx.clock()
    user = session.get(User, job.user_id)
    if user is None:
        raise UnknownUser(f"No user with id {job.user_id}.")
    to, rendered = _render(ctx, session, user, job.period, job.template_version)
    request_id = message_id(job.period, user.id, ctx.settings.mail_domain, request_id=job.request_id)
    lease, lease_ends = ctx.settings.claim_lease_seconds, _lease_ends(ctx)
    request = claims.take_send_now_request(
        session,
        job.request_id,
        job.period,
        user.id,
        message_id=request_id,
        template_version=job.template_version,
        lease_seconds=lease,
        now=now,
    )
    if request is None:
        # Nothing stored: the report kept is the one that went out.
        return Outcome.ALREADY_DONE
    report = StoredReport(job.template_version, rendered, now)
    keep_report(session, job.period, user.id, report)
    held, chosen_id = [request], request_id
    may_be_monthly = claims.monthly_may_follow(
        planned=None if run is None else run.planned, item_state=None if item is None else item.state
    )
    if may_be_monthly and not claims.is_sent(session, job.period, user.id):
        monthly_id = message_id(job.period, user.id, ctx.settings.mail_domain)
        monthly = claims.take(session, job.period, user.id, message_id=monthly_id, lease_seconds=lease)
        if monthly is not None:
            held, chosen_id = [monthly, request], monthly_id
    email = compose(
        rendered,
        to=to,
        mail_from=ctx.settings.mail_from,
        period=job.period,
        user_id=user.id,
        date=now,
        message_id=chosen_id,
        unsubscribe_url=ctx.unsubscribe_url(user.id),
    )
    return _Prepared(
        claims=held,
        email=email,
        address=to.addr_spec,
        lease_ends=lease_ends,
        report=report,
    )


def _render(
    ctx: Context, session: Session, user: User, period: Period, template_version: str
) -> tuple[Address, RenderedReport]:
    """Read the user's activity and render the report (before the claim: its lease is for the send)."""
    to = recipient(user.email, user.name)
    rendered = render(
        ctx.settings.templates_dir,
        template_version,
        name=user.name,
        summary=load_summary(session, user.id, period),
        look=ctx.look,
        locale=user.locale,
        unsubscribe_url=ctx.unsubscribe_url(user.id),
    )
    return to, rendered
