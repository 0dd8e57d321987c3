"""The store on SQLite: the per-report steps through the general functions of
:mod:`reports.items` and :mod:`reports.delivery.claims`, a statement each.

SQLite has neither row locks nor data-modifying CTEs: its write-intent transaction (``BEGIN
IMMEDIATE``, see :func:`reports.database.create_db_engine`) serializes the copies of a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime

from sqlalchemy import DateTime, bindparam, select, text
from sqlalchemy.orm import Session, sessionmaker

from reports import items
from reports.content.activity import load_summary
from reports.delivery import claims
from reports.delivery.store.port import (
    Inputs,
    ReadAndClaim,
    StoredReport,
    Transaction,
    keep_report,
    sendable,
    sendable_parameters,
)
from reports.models import ItemState, PeriodRun, Suppression, User
from reports.sql import Executor


def _comparable(timestamp: str) -> str:
    # Timestamps are text in whatever form the writer used: compare them normalized.
    return f"datetime({timestamp})"


_ITEM_AND_SENDABLE = text(
    f"""
WITH item AS (SELECT state FROM report_items WHERE period = :period AND user_id = :user_id)
SELECT (SELECT state FROM item), EXISTS (SELECT 1 {sendable(_comparable)})
"""
).bindparams(bindparam("start", type_=DateTime()), bindparam("end", type_=DateTime()))


class SqliteStore:
    """:class:`~reports.delivery.store.port.Store` on SQLite."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    @contextmanager
    def transactions(self) -> Iterator[Transaction]:
        yield self._sessions.begin

    def read_and_claim(self, db: Executor, asked: ReadAndClaim) -> Inputs:
        period, user_id = asked.period, asked.user_id
        item_state, mailable = db.execute(_ITEM_AND_SENDABLE, sendable_parameters(asked)).one()
        run = db.execute(
            select(PeriodRun.state, PeriodRun.planned, PeriodRun.cursor).where(PeriodRun.period == str(period))
        ).one_or_none()
        user = db.execute(
            select(User.email, User.name, User.active, User.locale, Suppression.reason)
            .outerjoin(Suppression, Suppression.user_id == User.id)
            .where(User.id == user_id)
        ).one_or_none()
        inputs = Inputs(
            item_state=item_state,
            run_state=run.state if run else None,
            planned=bool(run and run.planned),
            cursor=run.cursor if run else None,
            email=user.email if user else None,
            name=user.name if user else None,
            active=bool(user and user.active),
            summary=load_summary(db, user_id, period),
            mailable=bool(mailable),
            suppressed=user.reason if user else None,
            locale=user.locale if user else None,
        )
        if not inputs.mailable:
            return inputs
        items.touch(db, period, user_id, now=asked.now)
        claimed = claims.take(db, period, user_id, message_id=asked.message_id, lease_seconds=asked.lease_seconds)
        return replace(inputs, claim=claimed)

    def record_sent(self, db: Executor, claim: claims.Claim, report: StoredReport, *, now: datetime) -> bool:
        # Item first, then delivery: the lock order of reading, so copies cannot deadlock.
        items.finish(db, claim.period, claim.user_id, ItemState.DELIVERED, now=now)
        if not claims.complete(db, claim, now=now):
            return False
        keep_report(db, claim.period, claim.user_id, report)
        return True
