"""The store on PostgreSQL: each per-report step is one statement, prepared by the driver.

Reading locks the item, reads the run, the user, their suppression-list entry and two months of
activity, and, when there is a report to mail, counts the attempt and takes the claim; recording
marks the item delivered and the claim sent and stores the report. Both run on one bare connection
per message (no ORM session), in autocommit: each step is one statement, and so its own
transaction, without a BEGIN and a COMMIT of two round trips more around it.

The message's few steps of more than one statement, on paths that send nothing (settling an item
that needs no email, giving a claim back after a failed send), commit statement by statement
too: each statement is one that may run again, so a crash between two of them leaves what the
next copy of the message finishes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine

from reports.content.activity import summarize
from reports.delivery import claims
from reports.delivery.store.port import (
    Inputs,
    ReadAndClaim,
    StoredReport,
    Transaction,
    sendable,
    sendable_parameters,
    with_columns,
)
from reports.sql import POSTGRESQL_NOW, Executor

# ``sendable`` reads the locked item, so the lock is granted before the claim's clock (the
# server's) is read. Data-modifying CTEs run whether or not the query reads them.
_READ_AND_CLAIM = with_columns(
    f"""
WITH item AS (
    SELECT state FROM report_items WHERE period = :period AND user_id = :user_id FOR UPDATE
), sendable AS (
    SELECT clock_timestamp() - statement_timestamp() AS lock_wait, {POSTGRESQL_NOW} AS claimed_at
    {sendable()}
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

# The item is locked before the claim, as reading locks it before it takes the claim: the claim's
# condition waits on the item's update (an InitPlan, run before the claim's row is locked). Without
# that order a copy taking the claim and this one recording it can deadlock. The report is stored
# only by the claim's holder, after the claim's row is locked.
_RECORD_SENT = with_columns(
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


class PostgresStore:
    """:class:`~reports.delivery.store.port.Store` on PostgreSQL."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @contextmanager
    def transactions(self) -> Iterator[Transaction]:
        # One connection per message, checked out (and pinged) once, not once per step. Between
        # its statements it holds no transaction open; one that broke meanwhile reconnects at its
        # next statement, which the record's retries absorb.
        with self._engine.connect() as connection:
            yield functools.partial(_transaction_on, connection.execution_options(isolation_level="AUTOCOMMIT"))

    def read_and_claim(self, db: Executor, asked: ReadAndClaim) -> Inputs:
        period = asked.period
        claim = claims.Claim(period, asked.user_id, claims.new_token())
        rows = db.execute(
            _READ_AND_CLAIM,
            {
                **sendable_parameters(asked),
                "previous": period.previous().start,
                "now": asked.now,
                "message_id": asked.message_id,
                "token": claim.token,
                "lease": timedelta(seconds=asked.lease_seconds),
            },
        ).all()
        first = rows[0]
        lock_wait, taken = first[12], first[13]
        inputs = Inputs(
            item_state=first[0],
            run_state=first[1],
            planned=bool(first[2]),
            cursor=first[3] or 0,
            email=first[4],
            name=first[5],
            active=bool(first[6]),
            summary=summarize(period, ((bool(r[7]), r[8], r[9], r[10]) for r in rows if r[8] is not None)),
            mailable=lock_wait is not None,
            suppressed=first[11],
            locale=first[14],
        )
        if lock_wait is None:
            return inputs
        lock_wait = float(lock_wait)
        if taken:
            return replace(inputs, claim=claim, lock_wait_seconds=lock_wait)
        # Read again: the statement's snapshot predates the lock, so it may not show the claim that
        # stopped this one (a copy that held the lock took it).
        claims.not_taken(db, claim)
        return replace(inputs, lock_wait_seconds=lock_wait)

    def record_sent(self, db: Executor, claim: claims.Claim, report: StoredReport, *, now: datetime) -> bool:
        recorded = db.execute(
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


@contextmanager
def _transaction_on(connection: Connection) -> Iterator[Connection]:
    # In autocommit SQLAlchemy's transaction sends the server nothing. It is kept for a statement
    # that fails: rolling it back is what lets the next statement reconnect a connection that
    # broke, instead of refusing until someone does.
    with connection.begin():
        yield connection
