"""The lock that keeps a prune from deleting a period's rows while something makes the period unfinished."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from reports.models import PeriodRun


def hold_off(session: Session, periods: Iterable[str]) -> None:
    """Keep a prune from deleting rows of ``periods`` until the transaction ends, so that what it
    makes unfinished (an item back to pending, a send-now request) is seen by the prune's next batch (or its drop).

    On PostgreSQL a shared lock on each run (``FOR KEY SHARE``: holders do not wait for one
    another), which the ``FOR UPDATE`` of :func:`finished` with ``lock`` excludes; a period with no
    run is never pruned. On SQLite every write transaction excludes the others.
    """
    session.execute(
        select(PeriodRun.period)
        .where(PeriodRun.period.in_(sorted(set(periods))))
        .order_by(PeriodRun.period)
        .with_for_update(read=True, key_share=True)
    )
