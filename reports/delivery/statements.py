"""The monthly report's statements: read and claim, then store and record the send.

On PostgreSQL each step is one statement, written once as SQL here and prepared by the driver.
Reading locks the item, reads the run, the user, their suppression-list entry and the two months of
activity, and, when there is a report to mail, counts the attempt and takes the delivery claim.
Recording marks the item delivered and the claim sent and stores the report as it was sent. That
is 2 statements in 2 transactions per report, where the general path (and SQLite, which has
neither data-modifying CTEs nor row locks) takes about 9; the SQLite path runs the same steps
through the general functions of :mod:`reports.items` and :mod:`reports.delivery.claims`,
so the two cannot drift in meaning, and on PostgreSQL :func:`read_and_claim` checks that the
statement's idea of "there is a report to mail" is :func:`mailable`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import column, select, text
from sqlalchemy.sql.selectable import TextualSelect

from reports import items
from reports.content.activity import Summary, load_summary, summarize
from reports.content.render import RenderedReport
from reports.content.view import should_send
from reports.delivery import claims
from reports.models import (
    FINAL_STATES,
    ItemState,
    PeriodRun,
    Report,
    ReportItem,
    RunState,
    Suppression,
    User,
)
from reports.periods import Period
from reports.sql import POSTGRESQL_NOW, Executor, dialect_name, upsert


@dataclass(frozen=True)
class Inputs:
    """What one report is built from, read under the item's row lock, and the claim taken with it."""

    #: ``None`` when the coordinator never recorded the item.
    item_state: str | None
    #: ``None`` when the period was never triggered.
    run_state: str | None
    planned: bool
    cursor: int
    #: ``None`` when the user does not exist.
    email: str | None
    name: str | None
    active: bool
    summary: Summary
    #: The user's own locale as stored (BCP 47), unchecked; ``None`` when they have none.
    locale: str | None = None
    #: Why the user is on the suppression list; ``None`` when they are not.
    suppressed: str | None = None
    #: The monthly email's claim, taken when the report is :func:`mailable`; ``None`` when it is
    #: not, or when the email already went out.
    claim: claims.Claim | None = None
    #: Seconds the statement waited for the item's row lock: the lease starts once it is granted.
    lock_wait_seconds: float = 0.0


@dataclass(frozen=True)
class StoredReport:
    """The report as it is mailed, kept in ``reports``."""

    template_version: str
    rendered: RenderedReport
    rendered_at: datetime


def mailable(inputs: Inputs, *, empty_month: str) -> bool:
    """Whether the item is waiting for an email that should go out: the claim is taken only then."""
    return (
        inputs.item_state is not None
        and inputs.item_state not in FINAL_STATES
        and inputs.run_state != RunState.CANCELLED
        and inputs.email is not None
        and inputs.active
        and inputs.suppressed is None
        and should_send(inputs.summary, empty_month=empty_month)
    )


def _with_columns(sql: str, *names: str) -> TextualSelect:
    """A statement whose result columns are fixed by position: SQLAlchemy then builds the result's
    metadata once per statement instead of once per execution from the cursor's description."""
    return text(sql).columns(*(column(name) for name in names))


_FINAL = ", ".join(sorted(f"'{state.value}'" for state in FINAL_STATES))

# ``sendable`` is :func:`mailable` in SQL; it reads the locked item, so the lock is granted before
# the claim's clock (the server's) is read. Data-modifying CTEs run whether or not the query reads them.
_READ_AND_CLAIM = _with_columns(
    f"""
WITH item AS (
    SELECT state FROM report_items WHERE period = :period AND user_id = :user_id FOR UPDATE
), sendable AS (
    SELECT clock_timestamp() - statement_timestamp() AS lock_wait, {POSTGRESQL_NOW} AS claimed_at
    FROM item JOIN users u ON u.id = :user_id LEFT JOIN period_runs r ON r.period = :period
    WHERE item.state NOT IN ({_FINAL}) AND r.state IS DISTINCT FROM '{RunState.CANCELLED.value}'
      AND u.email IS NOT NULL AND u.active
      AND NOT EXISTS (SELECT 1 FROM suppressions WHERE user_id = :user_id)
      AND (:send_empty OR EXISTS (
          SELECT 1 FROM activities WHERE user_id = :user_id AND occurred_at >= :start AND occurred_at < :end
      ))
), attempted AS (
    UPDATE report_items SET attempts = attempts + 1, updated_at = :now, enqueued_at = coalesce(enqueued_at, :now)
    WHERE period = :period AND user_id = :user_id AND EXISTS (SELECT 1 FROM sendable)
), claimed AS (
    INSERT INTO deliveries (period, user_id, state, message_id, claim_token, lease_expires_at, times_taken, claimed_at)
    SELECT :period, :user_id, 'claimed', :message_id, :token, claimed_at + :lease, 1, claimed_at
    FROM sendable
    ON CONFLICT (period, user_id) DO UPDATE SET state = 'claimed', claim_token = excluded.claim_token,
        lease_expires_at = excluded.lease_expires_at, times_taken = deliveries.times_taken + 1,
        claimed_at = excluded.claimed_at
    WHERE deliveries.state = 'claimed' AND deliveries.lease_expires_at <= excluded.claimed_at
    RETURNING 1
)
SELECT (SELECT state FROM item), r.state, r.planned, r.cursor, u.email, u.name, u.active,
       a.in_period, a.category, a.n, a.total, s.reason,
       extract(epoch FROM (SELECT lock_wait FROM sendable)), (SELECT count(*) FROM claimed), u.locale
FROM (SELECT 1) AS one
LEFT JOIN period_runs r ON r.period = :period
LEFT JOIN users u ON u.id = :user_id
LEFT JOIN suppressions s ON s.user_id = :user_id
LEFT JOIN LATERAL (
    SELECT occurred_at >= :start AS in_period, category, count(*) AS n, sum(amount_cents) AS total
    FROM activities
    WHERE user_id = :user_id AND occurred_at >= :previous AND occurred_at < :end
    GROUP BY 1, 2
) a ON true
""",
    "item_state",
    "run_state",
    "planned",
    "cursor",
    "email",
    "name",
    "active",
    "in_period",
    "category",
    "n",
    "total",
    "reason",
    "lock_wait",
    "taken",
    "locale",
)


def read_and_claim(
    session: Executor,
    period: Period,
    user_id: int,
    *,
    message_id: str,
    lease_seconds: float,
    now: datetime,
    empty_month: str,
) -> Inputs:
    """Lock the item (serializing copies of the message), read everything the report needs, and,
    when it is :func:`mailable`, count the attempt and claim the monthly email.

    The claim is ``None`` when the email already went out; raises :class:`ClaimHeld` while another
    copy's lease runs (see :func:`reports.delivery.claims.take`). The lease runs on the database
    server's clock from when the lock was granted; ``now`` stamps the item.
    """
    if _is_sqlite(session):
        inputs = _read_each(session, period, user_id)
        if not mailable(inputs, empty_month=empty_month):
            return inputs
        items.touch(session, period, user_id, now=now)
        claimed = claims.take(session, period, user_id, message_id=message_id, lease_seconds=lease_seconds)
        return replace(inputs, claim=claimed)
    claim = claims.Claim(period, user_id, claims.new_token())
    rows = session.execute(
        _READ_AND_CLAIM,
        {
            "period": str(period),
            "user_id": user_id,
            "start": period.start,
            "previous": period.previous().start,
            "end": period.end,
            "send_empty": empty_month == "send",
            "now": now,
            "message_id": message_id,
            "token": claim.token,
            "lease": timedelta(seconds=lease_seconds),
        },
    ).all()
    first = rows[0]
    inputs = Inputs(
        item_state=first[0],
        run_state=first[1],
        planned=bool(first[2]),
        cursor=first[3] or 0,
        email=first[4],
        name=first[5],
        active=bool(first[6]),
        summary=summarize(period, ((bool(r[7]), r[8], r[9], r[10]) for r in rows if r[8] is not None)),
        suppressed=first[11],
        locale=first[14],
    )
    lock_wait, taken = first[12], first[13]
    if (lock_wait is not None) != mailable(inputs, empty_month=empty_month):
        raise AssertionError(f"_READ_AND_CLAIM and mailable() disagree for period {period}, user {user_id}.")
    if lock_wait is None:
        return inputs
    lock_wait = float(lock_wait)
    if taken:
        return replace(inputs, claim=claim, lock_wait_seconds=lock_wait)
    # Read again: the statement's snapshot predates the lock, so it may not show the claim that
    # stopped this one (a copy that held the lock took it).
    claims.not_taken(session, claim)
    return replace(inputs, lock_wait_seconds=lock_wait)


def _read_each(session: Executor, period: Period, user_id: int) -> Inputs:
    # SQLite has no row locks: its write-intent transaction (BEGIN IMMEDIATE) serializes the copies.
    item_state = session.scalar(
        select(ReportItem.state).where(ReportItem.period == str(period), ReportItem.user_id == user_id)
    )
    run = session.execute(
        select(PeriodRun.state, PeriodRun.planned, PeriodRun.cursor).where(PeriodRun.period == str(period))
    ).one_or_none()
    user = session.execute(
        select(User.email, User.name, User.active, User.locale, Suppression.reason)
        .outerjoin(Suppression, Suppression.user_id == User.id)
        .where(User.id == user_id)
    ).one_or_none()
    return Inputs(
        item_state=item_state,
        run_state=run.state if run else None,
        planned=bool(run and run.planned),
        cursor=run.cursor if run else 0,
        email=user.email if user else None,
        name=user.name if user else None,
        active=bool(user and user.active),
        summary=load_summary(session, user_id, period),
        suppressed=user.reason if user else None,
        locale=user.locale if user else None,
    )


def store(session: Executor, period: Period, user_id: int, report: StoredReport) -> None:
    """Keep the report as it was (or was about to be) mailed."""
    session.execute(
        upsert(
            session,
            Report.__table__,
            {
                "period": str(period),
                "user_id": user_id,
                "template_version": report.template_version,
                "subject": report.rendered.subject,
                "body_text": report.rendered.text,
                "body_html": report.rendered.html,
                "rendered_at": report.rendered_at,
            },
            key=["period", "user_id"],
        )
    )


# The item is locked before the claim, as reading locks it before it takes the claim: the claim's
# condition waits on the item's update (an InitPlan, run before the claim's row is locked). Without
# that order a copy taking the claim and this one recording it can deadlock. The report is stored
# only by the claim's holder, after the claim's row is locked.
_RECORD_SENT = _with_columns(
    """
WITH finished AS (
    UPDATE report_items SET state = 'delivered', finished_at = :now, updated_at = :now, last_error = NULL
    WHERE period = :period AND user_id = :user_id AND state IN ('pending', 'dead')
    RETURNING 1
), sent AS (
    UPDATE deliveries SET state = 'sent', sent_at = :now
    WHERE period = :period AND user_id = :user_id AND claim_token = :token
      AND (SELECT count(*) FROM finished) >= 0
    RETURNING 1
), stored AS (
    INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at)
    SELECT :period, :user_id, :template_version, :subject, :body_text, :body_html, :rendered_at FROM sent
    ON CONFLICT (period, user_id) DO UPDATE SET template_version = excluded.template_version,
        subject = excluded.subject, body_text = excluded.body_text, body_html = excluded.body_html,
        rendered_at = excluded.rendered_at
)
SELECT count(*) FROM sent
""",
    "recorded",
)


def record_sent(session: Executor, claim: claims.Claim, report: StoredReport, *, now: datetime) -> bool:
    """Mark the item delivered and the claim sent, and store the report; ``False`` (and nothing
    stored) if the claim was taken over meanwhile."""
    if _is_sqlite(session):
        # Item first, then delivery: the lock order of reading, so copies cannot deadlock.
        items.finish(session, claim.period, claim.user_id, ItemState.DELIVERED, now=now)
        if not claims.complete(session, claim, now=now):
            return False
        store(session, claim.period, claim.user_id, report)
        return True
    recorded = session.execute(
        _RECORD_SENT,
        {
            "period": str(claim.period),
            "user_id": claim.user_id,
            "token": claim.token,
            "now": now,
            "template_version": report.template_version,
            "subject": report.rendered.subject,
            "body_text": report.rendered.text,
            "body_html": report.rendered.html,
            "rendered_at": report.rendered_at,
        },
    ).scalar_one()
    return bool(recorded)


def _is_sqlite(db: Executor) -> bool:
    return dialect_name(db) == "sqlite"
