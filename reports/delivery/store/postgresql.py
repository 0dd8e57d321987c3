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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy.exc
from sqlalchemy import Connection, Engine, Result
from sqlalchemy.sql.selectable import TextualSelect

from reports import partitions
from reports.content.activity import summarize
from reports.delivery import claims
from reports.delivery.store.port import (
    Inputs,
    ReadAndClaim,
    StoredReport,
    Transaction,
    mailable,
    sendable_parameters,
    with_columns,
)
from reports.sql import POSTGRESQL_NOW, Executor


@dataclass(frozen=True)
class _Tables:
    """The tables a message's statements name: one month's partitions, or their parents."""

    report_items: str = "report_items"
    deliveries: str = "deliveries"
    reports: str = "reports"


#: The parents: partitioning routes each row to its month, and a month with no partitions reads as empty.
_PARENTS = _Tables()


@functools.lru_cache(maxsize=64)
def _partitions(period: str) -> _Tables:
    # A month's own partitions, named directly: a prepared statement over the parent runs on a
    # generic plan that locks every month's partition on each execution, a cost that grows with
    # each month kept.
    return _Tables(**{table: partitions.name(table, period) for table in partitions.PARTITIONED})


@functools.lru_cache(maxsize=64)
def _read_and_claim(t: _Tables) -> TextualSelect:
    # Each table is read once: ``facts`` reads the item (locking it) before the server's clock,
    # so the claim's lease starts when the lock is granted. Data-modifying CTEs run whether or not
    # the query reads them.
    condition = mailable(
        item_state="item_state",
        run_state="run_state",
        email="email",
        active="active",
        suppressed="suppressed",
        active_in_period="EXISTS (SELECT 1 FROM activity WHERE in_period)",
    )
    return with_columns(
        f"""
WITH item AS (
    SELECT state FROM {t.report_items} WHERE period = :period AND user_id = :user_id FOR UPDATE
), activity AS (
    SELECT occurred_at >= :start AS in_period, category, count(*) AS n, sum(amount_cents) AS total
    FROM activities
    WHERE user_id = :user_id AND occurred_at >= :previous AND occurred_at < :end
    GROUP BY 1, 2
), facts AS (
    SELECT item.state AS item_state, r.state AS run_state, r.planned, r.cursor, u.email, u.name, u.active,
           u.locale, s.reason, s.user_id IS NOT NULL AS suppressed,
           clock_timestamp() - statement_timestamp() AS lock_wait, {POSTGRESQL_NOW} AS claimed_at
    FROM (SELECT 1) AS one
    LEFT JOIN item ON true
    LEFT JOIN period_runs r ON r.period = :period
    LEFT JOIN users u ON u.id = :user_id
    LEFT JOIN suppressions s ON s.user_id = :user_id
), sendable AS (
    SELECT lock_wait, claimed_at FROM facts WHERE {condition}
), attempted AS (
    UPDATE {t.report_items} SET attempts = attempts + 1, updated_at = :now, enqueued_at = coalesce(enqueued_at, :now)
    WHERE period = :period AND user_id = :user_id AND EXISTS (SELECT 1 FROM sendable)
), claimed AS (
    INSERT INTO {t.deliveries} AS d
        (period, user_id, state, message_id, claim_token, lease_expires_at, times_taken, claimed_at)
    SELECT :period, :user_id, 'claimed', :message_id, :token, claimed_at + :lease, 1, claimed_at
    FROM sendable
    ON CONFLICT (period, user_id) DO UPDATE SET state = 'claimed', claim_token = excluded.claim_token,
        lease_expires_at = excluded.lease_expires_at, times_taken = d.times_taken + 1,
        claimed_at = excluded.claimed_at
    WHERE d.state = 'claimed' AND d.lease_expires_at <= excluded.claimed_at
    RETURNING 1
)
SELECT f.item_state, f.run_state, f.planned, f.cursor, f.email, f.name, f.active,
       a.in_period, a.category, a.n, a.total, f.reason,
       extract(epoch FROM (SELECT lock_wait FROM sendable)), (SELECT count(*) FROM claimed), f.locale
FROM facts AS f LEFT JOIN activity AS a ON true
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


@functools.lru_cache(maxsize=64)
def _record_sent(t: _Tables) -> TextualSelect:
    # The item is locked before the claim, as reading locks it before it takes the claim: the
    # claim's condition waits on the item's update (an InitPlan, run before the claim's row is
    # locked). Without that order a copy taking the claim and this one recording it can deadlock.
    # The report is stored only by the claim's holder, after the claim's row is locked.
    return with_columns(
        f"""
WITH finished AS (
    UPDATE {t.report_items} SET state = 'delivered', finished_at = :now, updated_at = :now, last_error = NULL
    WHERE period = :period AND user_id = :user_id AND state IN ('pending', 'dead')
    RETURNING 1
), sent AS (
    UPDATE {t.deliveries} SET state = 'sent', sent_at = :now
    WHERE period = :period AND user_id = :user_id AND claim_token = :token
      AND (SELECT count(*) FROM finished) >= 0
    RETURNING 1
), stored AS (
    INSERT INTO {t.reports} AS r (period, user_id, template_version, subject, body_text, body_html, rendered_at)
    SELECT :period, :user_id, :template_version, :subject, :body_text, :body_html, :rendered_at FROM sent
    ON CONFLICT (period, user_id) DO UPDATE SET template_version = excluded.template_version,
        subject = excluded.subject, body_text = excluded.body_text, body_html = excluded.body_html,
        rendered_at = excluded.rendered_at
)
SELECT count(*) FROM sent
""",
        "recorded",
    )


def _execute(
    db: Executor, period: str, statement: Callable[[_Tables], TextualSelect], parameters: dict[str, Any]
) -> Result[*tuple[Any, ...]]:
    """Run ``statement`` on ``period``'s partitions, or on the parent tables when the month has none
    (never triggered, or pruned): there it finds no rows, as it would in an empty partition."""
    try:
        return db.execute(statement(_partitions(period)), parameters)
    except sqlalchemy.exc.ProgrammingError as error:
        if not isinstance(error.orig, psycopg.errors.UndefinedTable):
            raise
    return db.execute(statement(_PARENTS), parameters)


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
        rows = _execute(
            db,
            str(period),
            _read_and_claim,
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
            cursor=first[3],
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
        recorded = _execute(
            db,
            str(claim.period),
            _record_sent,
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
