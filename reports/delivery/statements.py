"""The monthly report's statements: read, store and claim, record the send.

On PostgreSQL each step is one statement, written once as SQL here and prepared by the driver:
reading locks the item and reads the run, the user, their suppression-list entry and the two
months of activity together;
storing writes the report, counts the attempt and takes the delivery claim together; recording
marks the item delivered and the claim sent together. That is 3 statements in 2 transactions
per report, where the general path (and SQLite, which has neither data-modifying CTEs nor row
locks) takes about 9; the SQLite path runs the same steps through the general functions of
:mod:`reports.fanout.items` and :mod:`reports.delivery.claims`, so the two cannot drift in meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import column, select, text
from sqlalchemy.sql.selectable import TextualSelect

from reports.content.activity import Summary, load_summary, summarize
from reports.content.render import RenderedReport
from reports.delivery import claims
from reports.errors import ClaimHeld
from reports.fanout import items
from reports.models import DeliveryState, ItemState, PeriodRun, Report, ReportItem, Suppression, User
from reports.periods import Period
from reports.sql import Executor, dialect_name, upsert


@dataclass(frozen=True)
class Inputs:
    """What one report is built from, read under the item's row lock."""

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
    #: Why the user is on the suppression list; ``None`` when they are not.
    suppressed: str | None = None


def _with_columns(sql: str, *names: str) -> TextualSelect:
    """A statement whose result columns are fixed by position: SQLAlchemy then builds the result's
    metadata once per statement instead of once per execution from the cursor's description."""
    return text(sql).columns(*(column(name) for name in names))


_READ = _with_columns(
    """
WITH item AS (
    SELECT state FROM report_items WHERE period = :period AND user_id = :user_id FOR UPDATE
)
SELECT (SELECT state FROM item), r.state, r.planned, r.cursor, u.email, u.name, u.active,
       a.in_period, a.category, a.n, a.total, s.reason
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
)


def read(session: Executor, period: Period, user_id: int) -> Inputs:
    """Lock the item (serializing copies of the message) and read everything the report needs."""
    if _is_sqlite(session):
        return _read_each(session, period, user_id)
    rows = session.execute(
        _READ,
        {
            "period": str(period),
            "user_id": user_id,
            "start": period.start,
            "previous": period.previous().start,
            "end": period.end,
        },
    ).all()
    first = rows[0]
    summary = summarize(period, ((bool(r[7]), r[8], r[9], r[10]) for r in rows if r[8] is not None))
    return Inputs(
        item_state=first[0],
        run_state=first[1],
        planned=bool(first[2]),
        cursor=first[3] or 0,
        email=first[4],
        name=first[5],
        active=bool(first[6]),
        summary=summary,
        suppressed=first[11],
    )


def _read_each(session: Executor, period: Period, user_id: int) -> Inputs:
    # SQLite has no row locks: its write-intent transaction (BEGIN IMMEDIATE) serializes the copies.
    item_state = session.scalar(
        select(ReportItem.state).where(ReportItem.period == str(period), ReportItem.user_id == user_id)
    )
    run = session.execute(
        select(PeriodRun.state, PeriodRun.planned, PeriodRun.cursor).where(PeriodRun.period == str(period))
    ).one_or_none()
    user = session.execute(
        select(User.email, User.name, User.active, Suppression.reason)
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
    )


_STORE_AND_CLAIM = _with_columns(
    """
WITH stored AS (
    INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at)
    VALUES (:period, :user_id, :template_version, :subject, :body_text, :body_html, :now)
    ON CONFLICT (period, user_id) DO UPDATE SET template_version = excluded.template_version,
        subject = excluded.subject, body_text = excluded.body_text, body_html = excluded.body_html,
        rendered_at = excluded.rendered_at
), attempted AS (
    UPDATE report_items SET attempts = attempts + 1, updated_at = :now, enqueued_at = coalesce(enqueued_at, :now)
    WHERE period = :period AND user_id = :user_id
), claimed AS (
    INSERT INTO deliveries (period, user_id, state, message_id, claim_token, lease_expires_at, claims, claimed_at)
    VALUES (:period, :user_id, 'claimed', :message_id, :token, :lease_expires_at, 1, :claimed_at)
    ON CONFLICT (period, user_id) DO UPDATE SET state = 'claimed', claim_token = excluded.claim_token,
        lease_expires_at = excluded.lease_expires_at, claims = deliveries.claims + 1,
        claimed_at = excluded.claimed_at
    WHERE deliveries.state = 'claimed' AND deliveries.lease_expires_at <= :claimed_at
    RETURNING 1
)
SELECT (SELECT count(*) FROM claimed), d.state, d.lease_expires_at
FROM (SELECT 1) AS one LEFT JOIN deliveries d ON d.period = :period AND d.user_id = :user_id
""",
    "taken",
    "state",
    "lease_expires_at",
)


def store_and_claim(
    session: Executor,
    period: Period,
    user_id: int,
    *,
    template_version: str,
    rendered: RenderedReport,
    message_id: str,
    lease_seconds: float,
    now: datetime,
    claimed_at: datetime,
) -> claims.Claim | None:
    """Store the report as it is about to be sent, count the attempt, and claim the monthly email.

    ``None`` when the email already went out; raises :class:`ClaimHeld` while another copy's
    lease runs (see :func:`reports.delivery.claims.take`).
    """
    if _is_sqlite(session):
        _store_each(session, period, user_id, template_version=template_version, rendered=rendered, now=now)
        return claims.take(session, period, user_id, message_id=message_id, lease_seconds=lease_seconds, now=claimed_at)
    claim = claims.Claim(period, user_id, claims.new_token())
    taken, state, expires = session.execute(
        _STORE_AND_CLAIM,
        {
            "period": str(period),
            "user_id": user_id,
            "template_version": template_version,
            "subject": rendered.subject,
            "body_text": rendered.text,
            "body_html": rendered.html,
            "now": now,
            "message_id": message_id,
            "token": claim.token,
            "claimed_at": claimed_at,
            "lease_expires_at": claims.lease_end(claimed_at, lease_seconds),
        },
    ).one()
    if taken:
        return claim
    # The statement's snapshot shows the claim as it was: someone else's.
    if state in (DeliveryState.SENT, DeliveryState.DEAD):
        return None
    raise ClaimHeld(retry_after_seconds=max((expires - claimed_at).total_seconds(), 0.0))


def _store_each(
    session: Executor, period: Period, user_id: int, *, template_version: str, rendered: RenderedReport, now: datetime
) -> None:
    session.execute(
        upsert(
            session,
            Report.__table__,
            {
                "period": str(period),
                "user_id": user_id,
                "template_version": template_version,
                "subject": rendered.subject,
                "body_text": rendered.text,
                "body_html": rendered.html,
                "rendered_at": now,
            },
            key=["period", "user_id"],
        )
    )
    items.touch(session, period, user_id, now=now)


# The item is locked before the claim, as reading locks it before storing takes the claim: the
# claim's condition waits on the item's update (an InitPlan, run before the claim's row is
# locked). Without that order a copy taking the claim and this one recording it can deadlock.
_RECORD_SENT = _with_columns(
    """
WITH finished AS (
    UPDATE report_items SET state = 'delivered', finished_at = :now, updated_at = :now, last_error = NULL
    WHERE period = :period AND user_id = :user_id AND state IN ('pending', 'dead')
    RETURNING 1
)
UPDATE deliveries SET state = 'sent', sent_at = :now
WHERE period = :period AND user_id = :user_id AND claim_token = :token
  AND (SELECT count(*) FROM finished) >= 0
RETURNING 1
""",
    "recorded",
)


def record_sent(session: Executor, claim: claims.Claim, *, now: datetime) -> bool:
    """Mark the item delivered and the claim sent; ``False`` if the claim was taken over meanwhile."""
    if _is_sqlite(session):
        # Item first, then delivery: the lock order of reading, so copies cannot deadlock.
        items.finish(session, claim.period, claim.user_id, ItemState.DELIVERED, now=now)
        return claims.complete(session, claim, now=now)
    return (
        session.execute(
            _RECORD_SENT,
            {
                "period": str(claim.period),
                "user_id": claim.user_id,
                "token": claim.token,
                "now": now,
            },
        ).first()
        is not None
    )


def _is_sqlite(db: Executor) -> bool:
    return dialect_name(db) == "sqlite"
