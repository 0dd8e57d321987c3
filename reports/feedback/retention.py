"""Feedback events go once nothing needs them: after the months kept and the soft-bounce window.

An event carries the address it was about. Past both, it suppresses nobody and counts toward no
soft-bounce limit; only an event a suppression points to is still read (the console shows why a
user is suppressed), and it stays. The rest are deleted in batches, and added to
:class:`~reports.models.FeedbackPruned`, so that the exporter's event counters never go down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, delete, exists, func, select
from sqlalchemy.orm import Session, sessionmaker

from reports.models import FeedbackEvent, FeedbackMatch, FeedbackPruned, Suppression
from reports.periods import Period
from reports.sql import after, insert_on_conflict


@dataclass
class Outcome:
    #: Events received before this moment were pruned.
    before: datetime
    #: Events deleted (or, in a dry run, that would be).
    deleted: int = 0
    #: Events as old, kept because a suppression points to them.
    kept_for_suppressions: int = 0
    #: False when ``should_stop`` ended the prune early: run it again to finish.
    finished: bool = True


def cutoff(oldest_kept: Period, now: datetime, soft_bounce_window: timedelta) -> datetime:
    """Events received (and occurred) before the oldest month kept, and before the soft-bounce
    window, can go."""
    return min(oldest_kept.start, now - soft_bounce_window)


def prune(
    sessions: sessionmaker[Session],
    *,
    before: datetime,
    batch_size: int,
    dry_run: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
) -> Outcome:
    """Delete the events received and occurred before ``before`` that no suppression points to, one short
    transaction a batch, until ``should_stop`` says to stop between batches."""
    outcome = Outcome(before)
    with sessions.begin() as session:
        outcome.kept_for_suppressions = session.scalar(select(func.count()).where(_old(before), _suppressing())) or 0
        if dry_run:
            outcome.deleted = session.scalar(select(func.count()).where(_old(before), ~_suppressing())) or 0
            return outcome
    last: int | None = None
    while True:
        with sessions.begin() as session:
            ids = session.scalars(
                select(FeedbackEvent.id)
                .where(_old(before), ~_suppressing(), after(FeedbackEvent.id, last))
                .order_by(FeedbackEvent.id)
                .limit(batch_size)
            ).all()
            if not ids:
                return outcome
            outcome.deleted += _delete(session, list(ids))
        last = ids[-1]
        if should_stop():
            outcome.finished = False
            return outcome


def _old(before: datetime) -> ColumnElement[bool]:
    # Both times: the soft-bounce limit counts an event by when it occurred, the provider's time,
    # which is later than when it was received when the provider's clock is ahead of ours.
    return and_(FeedbackEvent.received_at < before, FeedbackEvent.occurred_at < before)


def _suppressing() -> ColumnElement[bool]:
    return exists().where(
        and_(Suppression.provider == FeedbackEvent.provider, Suppression.event_id == FeedbackEvent.event_id)
    )


def _delete(session: Session, ids: list[int]) -> int:
    """Delete these events and their matches, and count what this transaction deleted: a prune
    running beside this one deletes nothing twice, and counts nothing twice."""
    matched = set(
        session.scalars(delete(FeedbackMatch).where(FeedbackMatch.event.in_(ids)).returning(FeedbackMatch.event))
    )
    gone = session.execute(
        delete(FeedbackEvent)
        .where(FeedbackEvent.id.in_(ids))
        .returning(FeedbackEvent.id, FeedbackEvent.provider, FeedbackEvent.kind)
    ).all()
    events = Counter((provider, kind) for _id, provider, kind in gone)
    unmatched = Counter((provider, kind) for event, provider, kind in gone if event not in matched)
    if events:
        statement = insert_on_conflict(session, FeedbackPruned.__table__).values(
            [
                {"provider": provider, "kind": kind, "events": n, "unmatched": unmatched[(provider, kind)]}
                for (provider, kind), n in sorted(events.items())
            ]
        )
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["provider", "kind"],
                set_={
                    "events": FeedbackPruned.events + statement.excluded.events,
                    "unmatched": FeedbackPruned.unmatched + statement.excluded.unmatched,
                },
            )
        )
    return len(gone)
