"""State changes of report items. An item leaves ``pending`` once and returns only by a replay.

A delivery is the one fact that outranks the rest: a sent email makes its item ``delivered``
even if a copy of its message died meanwhile, and a late dead letter never marks dead an item
whose email went out.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, exists, func, update

from reports.models import Delivery, DeliveryState, ItemState, ReportItem
from reports.periods import Period
from reports.sql import Executor, rowcount

#: Longest error text kept on an item; the dead-letter store keeps the full traceback.
ERROR_TEXT_LIMIT = 2000


def waiting(period: Period) -> tuple[ColumnElement[bool], ...]:
    """The period's items waiting to be released (pending, with a due time), in the words of the
    partial indexes' condition (:data:`reports.models.WAITING`), so every query of them uses one."""
    return (
        ReportItem.period == str(period),
        ReportItem.state == ItemState.PENDING,
        ReportItem.due_at.is_not(None),
    )


def finish(
    session: Executor, period: Period, user_id: int, state: ItemState, *, now: datetime, error: str | None = None
) -> bool:
    """Move a pending item to a final ``state``; ``False`` if it had already finished.

    ``delivered`` also ends a ``dead`` item; ``dead`` is not given to an item whose email was sent.
    """
    leaves = (ItemState.PENDING, ItemState.DEAD) if state == ItemState.DELIVERED else (ItemState.PENDING,)
    conditions: list[ColumnElement[bool]] = [ReportItem.state.in_(leaves)]
    if state == ItemState.DEAD:
        conditions.append(
            ~exists().where(
                Delivery.period == ReportItem.period,
                Delivery.user_id == ReportItem.user_id,
                Delivery.state == DeliveryState.SENT,
            )
        )
    return bool(
        rowcount(
            session.execute(
                update(ReportItem)
                .where(ReportItem.period == str(period), ReportItem.user_id == user_id, *conditions)
                .values(
                    state=state,
                    finished_at=now,
                    updated_at=now,
                    last_error=error[:ERROR_TEXT_LIMIT] if error else None,
                )
                .execution_options(synchronize_session=False)
            )
        )
    )


def touch(session: Executor, period: Period, user_id: int, *, now: datetime) -> None:
    """Count an attempt at the item; its message running is proof it was handed out."""
    session.execute(
        update(ReportItem)
        .where(ReportItem.period == str(period), ReportItem.user_id == user_id)
        .values(
            attempts=ReportItem.attempts + 1, updated_at=now, enqueued_at=func.coalesce(ReportItem.enqueued_at, now)
        )
        .execution_options(synchronize_session=False)
    )
