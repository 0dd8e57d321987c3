"""Provider feedback made durable and applied: each event stored once, matched to its users, and
the users suppressed that a hard bounce, a complaint, an unsubscribe or too many soft bounces name.

Everything for one webhook request runs in the caller's one transaction, committed before the
provider is answered: a retry finds its events stored and changes nothing, a crash loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.orm import Session

from reports.feedback.events import Event, Kind, Provider
from reports.models import (
    Delivery,
    DeliveryState,
    FeedbackEvent,
    FeedbackMatch,
    PeriodRun,
    SuppressionReason,
    User,
    WebhookToken,
)
from reports.sql import insert_ignoring_conflicts, rowcount
from reports.unsubscribe import suppressions

#: What each kind does to the users it matches; a soft bounce suppresses only past the limit.
SUPPRESSES = {
    Kind.HARD_BOUNCE: SuppressionReason.BOUNCED,
    Kind.COMPLAINT: SuppressionReason.COMPLAINED,
    Kind.UNSUBSCRIBE: SuppressionReason.UNSUBSCRIBED,
}

#: Most users one address is matched to: a shared mailbox, not a whole table.
MAX_USERS_PER_ADDRESS = 100

#: Periods searched for the email an event without headers was about: a year and a month.
PERIODS_SEARCHED = 13

#: How long after the email was sent its bounce may carry an earlier time (the provider's clock).
_CLOCK_SLACK = timedelta(hours=1)


@dataclass(frozen=True)
class Policy:
    """When soft bounces suppress: ``limit`` of them within ``window``."""

    soft_bounce_limit: int
    soft_bounce_window: timedelta


@dataclass(frozen=True)
class Recorded:
    """What one request's events did."""

    stored: int = 0
    #: Events stored before (a provider's retry): nothing was done again.
    duplicates: int = 0
    #: Events that matched no user.
    unmatched: int = 0
    #: Users this request suppressed.
    suppressed: tuple[int, ...] = ()


def remember_token(session: Session, provider: Provider, token: str, *, now: datetime, keep: timedelta) -> bool:
    """Record a signature token's one use; ``False`` if it was used before (a replay).

    Tokens older than ``keep`` are pruned: by then a signature that carries them is stale anyway.
    """
    session.execute(delete(WebhookToken).where(WebhookToken.seen_at < now - keep))
    added = session.execute(
        insert_ignoring_conflicts(session, WebhookToken.__table__)
        .values(provider=provider.value, token=token, seen_at=now)
        .returning(WebhookToken.__table__.c.token)
    ).first()
    return added is not None


def record(session: Session, found: Sequence[Event], *, now: datetime, policy: Policy) -> Recorded:
    """Store each event once, match it, and suppress the users it says to."""
    stored = duplicates = unmatched = 0
    suppressed: list[int] = []
    for event in found:
        row_id = _store(session, event, now)
        if row_id is None:
            duplicates += 1
            continue
        stored += 1
        matched = _match(session, event)
        unmatched += not matched
        for user_id in matched:
            period = (
                event.period if event.user_id == user_id and event.period else _sent_period(session, user_id, event)
            )
            session.execute(
                insert_ignoring_conflicts(session, FeedbackMatch.__table__).values(
                    event=row_id, user_id=user_id, period=period
                )
            )
            if _apply(session, event, user_id, now=now, policy=policy):
                suppressed.append(user_id)
    return Recorded(stored=stored, duplicates=duplicates, unmatched=unmatched, suppressed=tuple(suppressed))


def _store(session: Session, event: Event, now: datetime) -> int | None:
    added = session.execute(
        insert_ignoring_conflicts(session, FeedbackEvent.__table__)
        .values(
            provider=event.provider.value,
            event_id=event.event_id,
            kind=event.kind.value,
            address=event.address,
            summary=event.summary,
            occurred_at=event.occurred_at,
            received_at=now,
        )
        .returning(FeedbackEvent.__table__.c.id)
    ).first()
    return None if added is None else int(added[0])


def _match(session: Session, event: Event) -> list[int]:
    """The user the email's headers name, if that user exists; else every user with the address."""
    if event.user_id is not None and session.get(User, event.user_id) is not None:
        return [event.user_id]
    by_address = (
        select(User.id)
        .where(func.lower(User.email) == event.address.lower())
        .order_by(User.id)
        .limit(MAX_USERS_PER_ADDRESS)
    )
    return list(session.scalars(by_address))


def _sent_period(session: Session, user_id: int, event: Event) -> str | None:
    """The period of the user's latest monthly email sent before the event: the one it was about."""
    recent = select(PeriodRun.period).order_by(PeriodRun.period.desc()).limit(PERIODS_SEARCHED)
    return session.scalar(
        select(Delivery.period)
        .where(
            Delivery.user_id == user_id,
            Delivery.period.in_(recent.scalar_subquery()),
            Delivery.state == DeliveryState.SENT,
            Delivery.sent_at <= event.occurred_at + _CLOCK_SLACK,
        )
        .order_by(Delivery.period.desc())
        .limit(1)
    )


def _apply(session: Session, event: Event, user_id: int, *, now: datetime, policy: Policy) -> bool:
    """Suppress ``user_id`` if ``event`` says to; ``True`` if this added the entry."""
    reason = SUPPRESSES.get(event.kind)
    source = f"{event.provider} {event.summary}"
    if reason is None:
        # Each user's soft bounces are counted under a lock on the user's row, so two bounces
        # arriving at once cannot both count one short of the limit.
        session.execute(select(User.id).where(User.id == user_id).with_for_update())
        soft = _soft_bounces(session, user_id, since=now - policy.soft_bounce_window)
        if soft < policy.soft_bounce_limit:
            return False
        reason = SuppressionReason.BOUNCED
        source = f"{event.provider} {soft} soft bounces in {policy.soft_bounce_window.days} days"
    return suppressions.add(
        session, user_id, reason, now=now, source=source, provider=event.provider.value, event_id=event.event_id
    )


def _soft_bounces(session: Session, user_id: int, *, since: datetime) -> int:
    return (
        session.scalar(
            select(func.count())
            .select_from(FeedbackMatch)
            .join(FeedbackEvent, FeedbackEvent.id == FeedbackMatch.event)
            .where(
                FeedbackMatch.user_id == user_id,
                FeedbackMatch.dismissed_at.is_(None),
                FeedbackEvent.kind == Kind.SOFT_BOUNCE.value,
                FeedbackEvent.occurred_at >= since,
            )
        )
        or 0
    )


def dismiss(session: Session, user_id: int, *, now: datetime) -> int:
    """Mark the user's feedback as dismissed (a false complaint, a bounce that was the provider's
    fault): it no longer counts toward soft bounces or a period's rates. The events stay stored, so
    the provider's retry of one changes nothing. Returns how many were dismissed."""
    return rowcount(
        session.execute(
            update(FeedbackMatch)
            .where(FeedbackMatch.user_id == user_id, FeedbackMatch.dismissed_at.is_(None))
            .values(dismissed_at=now)
        )
    )


@dataclass(frozen=True)
class Listed:
    """One event and one user it matched (``user_id`` ``None``: it matched nobody)."""

    received_at: datetime
    occurred_at: datetime
    provider: str
    kind: str
    event_id: str
    address: str
    summary: str
    user_id: int | None
    period: str | None
    dismissed: bool


def find(
    session: Session,
    *,
    provider: str | None = None,
    kind: str | None = None,
    period: str | None = None,
    user_id: int | None = None,
    limit: int = 100,
) -> list[Listed]:
    """The most recently received events first, one row per matched user."""
    filters = [
        column == value
        for column, value in (
            (FeedbackEvent.provider, provider),
            (FeedbackEvent.kind, kind),
            (FeedbackMatch.period, period),
            (FeedbackMatch.user_id, user_id),
        )
        if value is not None
    ]
    statement = (
        select(
            FeedbackEvent.received_at,
            FeedbackEvent.occurred_at,
            FeedbackEvent.provider,
            FeedbackEvent.kind,
            FeedbackEvent.event_id,
            FeedbackEvent.address,
            FeedbackEvent.summary,
            FeedbackMatch.user_id,
            FeedbackMatch.period,
            FeedbackMatch.dismissed_at.is_not(None).label("dismissed"),
        )
        .outerjoin(FeedbackMatch, FeedbackMatch.event == FeedbackEvent.id)
        .where(*filters)
        .order_by(FeedbackEvent.received_at.desc(), FeedbackEvent.id.desc(), FeedbackMatch.user_id)
        .limit(limit)
    )
    return [Listed(**row._mapping) for row in session.execute(statement)]


def count_by_provider_kind(session: Session) -> dict[tuple[str, str], int]:
    """Events stored, per (provider, kind), every pair present (0 when none)."""
    counts = {
        (str(p), str(k)): int(n)
        for p, k, n in session.execute(
            select(FeedbackEvent.provider, FeedbackEvent.kind, func.count()).group_by(
                FeedbackEvent.provider, FeedbackEvent.kind
            )
        )
    }
    return {(p.value, k.value): counts.get((p.value, k.value), 0) for p in Provider for k in Kind}


def unmatched_by_provider(session: Session) -> dict[str, int]:
    """Events that matched no user, per provider, every provider present."""
    no_match = ~select(FeedbackMatch.event).where(FeedbackMatch.event == FeedbackEvent.id).exists()
    counts = {
        str(p): int(n)
        for p, n in session.execute(
            select(FeedbackEvent.provider, func.count()).where(no_match).group_by(FeedbackEvent.provider)
        )
    }
    return {p.value: int(counts.get(p.value, 0)) for p in Provider}


def users_by_period(session: Session, periods: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per period, the users with an undismissed event of each kind about its email."""
    wanted = list(periods)
    rows = session.execute(
        select(FeedbackMatch.period, FeedbackEvent.kind, func.count(func.distinct(FeedbackMatch.user_id)))
        .join(FeedbackEvent, FeedbackEvent.id == FeedbackMatch.event)
        .where(and_(FeedbackMatch.period.in_(wanted), FeedbackMatch.dismissed_at.is_(None)))
        .group_by(FeedbackMatch.period, FeedbackEvent.kind)
    )
    figures: dict[str, dict[str, int]] = {period: {} for period in wanted}
    for period, kind, n in rows:
        figures[str(period)][str(kind)] = int(n)
    return figures
