"""State changes of report items. An item leaves ``pending`` once and never returns."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session

from reports.models import ItemState, ReportItem
from reports.periods import Period
from reports.sql import rowcount

#: Longest error text kept on an item; the dead-letter store keeps the full traceback.
ERROR_TEXT_LIMIT = 2000


def finish(
    session: Session, period: Period, user_id: int, state: ItemState, *, now: datetime, error: str | None = None
) -> bool:
    """Move a pending item to a final ``state``; ``False`` if it had already finished."""
    return bool(
        rowcount(session.execute(
            update(ReportItem)
            .where(
                ReportItem.period == str(period),
                ReportItem.user_id == user_id,
                ReportItem.state == ItemState.PENDING,
            )
            .values(
                state=state,
                finished_at=now,
                updated_at=now,
                last_error=error[:ERROR_TEXT_LIMIT] if error else None,
            )
            .execution_options(synchronize_session=False)
        ))
    )
