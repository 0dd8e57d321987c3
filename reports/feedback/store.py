"""Provider feedback made durable and applied: each event stored once, matched to its users, and
the users suppressed that a hard bounce, a complaint, an unsubscribe or too many soft bounces name.

Everything for one webhook request runs in the caller's one transaction, committed before the
provider is answered: a retry finds its events stored and changes nothing, a crash loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import String, and_, cast, delete, distinct, func, select, union_all, update
from sqlalchemy.orm import Session

from reports import suppressions
from reports.feedback.events import Event, Kind, Provider
from reports.models import (
    Delivery,
    DeliveryState,
    FeedbackEvent,
    FeedbackMatch,
    FeedbackPruned,
    PeriodRun,
    SuppressionReason,
    User,
    WebhookToken,
)
from reports.sql import insert_ignoring_conflicts, rowcount

#: What each kind does to the users it matches; a soft bounce suppresses only past the limit.
SUPPRESSES = {
    Kind.HARD_BOUNCE: SuppressionReason.BOUNCED,
    Kind.COMPLAINT: SuppressionReason.COMPLAINED,
    Kind.UNSUBSCRIBE: SuppressionReason.UNSUBSCRIBED,
}

#: Most users one address is matched to: a shared mailbox, not a whole table.
MAX_USERS_PER_ADDRESS = 100

#: Events inserted per statement.
STORE_CHUNK = 500

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
    """Record a request's token's one use; ``False`` if it was used before (a replay).

    The provider's tokens older than ``keep`` are pruned: by then a request that carries them is
    stale anyway. Each provider keeps its own for as long as its own requests stay fresh.
    """
    session.execute(
        delete(WebhookToken).where(WebhookToken.provider == provider.value, WebhookToken.seen_at < now - keep)
    )
    added = session.execute(
        insert_ignoring_conflicts(session, WebhookToken.__table__)
        .values(provider=provider.value, token=token, seen_at=now)
        .returning(WebhookToken.__table__.c.token)
    ).first()
    return added is not None


def record(session: Session, found: Sequence[Event], *, now: datetime, policy: Policy) -> Recorded:
    """Store each event once, match it, and suppress the users it says to.

    A provider's batch (SendGrid posts hundreds of events at once) costs a few statements for the
    whole batch (store, match, periods, matches, suppressions), plus three per user a soft bounce names.
    """
    unique = list({(e.provider, e.event_id): e for e in found}.values())
    row_ids = _store(session, unique, now)
    fresh = [e for e in unique if (e.provider, e.event_id) in row_ids]
    matched = _match(session, fresh)
    periods = _sent_periods(session, [(user, e) for e in fresh for user in matched[e] if _needs_period(e, user)])
    rows = [
        {"event": row_ids[(e.provider, e.event_id)], "user_id": user, "period": periods.get((user, e), e.period)}
        for e in fresh
        for user in matched[e]
    ]
    if rows:
        session.execute(insert_ignoring_conflicts(session, FeedbackMatch.__table__), rows)
    suppressed = suppressions.add_many(
        session,
        [
            suppressions.Entry(user_id, SUPPRESSES[e.kind], f"{e.provider} {e.summary}", e.provider.value, e.event_id)
            for e in fresh
            if e.kind in SUPPRESSES
            for user_id in matched[e]
        ],
        now=now,
    )
    soft = {user_id: e for e in fresh if e.kind == Kind.SOFT_BOUNCE for user_id in matched[e]}
    for user_id, event in sorted(soft.items()):
        if _suppress_if_soft_bounced(session, event, user_id, now=now, policy=policy):
            suppressed.append(user_id)
    return Recorded(
        stored=len(fresh),
        duplicates=len(found) - len(fresh),
        unmatched=sum(not matched[e] for e in fresh),
        suppressed=tuple(sorted(suppressed)),
    )


def _store(session: Session, found: list[Event], now: datetime) -> dict[tuple[str, str], int]:
    """Insert the events not stored yet; the row id of each one this inserted, by (provider, event id)."""
    table = FeedbackEvent.__table__
    stored: dict[tuple[str, str], int] = {}
    # In chunks: SQLite takes at most 32,766 parameters in one statement.
    for start in range(0, len(found), STORE_CHUNK):
        added = session.execute(
            insert_ignoring_conflicts(session, table)
            .values(
                [
                    {
                        "provider": e.provider.value,
                        "event_id": e.event_id,
                        "kind": e.kind.value,
                        "address": e.address,
                        "summary": e.summary,
                        "occurred_at": e.occurred_at,
                        "received_at": now,
                    }
                    for e in found[start : start + STORE_CHUNK]
                ]
            )
            .returning(table.c.id, table.c.provider, table.c.event_id)
        )
        stored.update({(str(provider), str(event_id)): int(row_id) for row_id, provider, event_id in added})
    return stored


def _match(session: Session, found: list[Event]) -> dict[Event, list[int]]:
    """Per event, the user the email's headers name, if that user exists; else every user with the
    address, whatever its case."""
    named = {e.user_id for e in found if e.user_id is not None}
    existing = set(session.scalars(select(User.id).where(User.id.in_(sorted(named))))) if named else set()
    addresses = {e.address.lower() for e in found if e.user_id not in existing}
    by_address: dict[str, list[int]] = {}
    if addresses:
        for user_id, address in session.execute(
            select(User.id, func.lower(User.email))
            .where(func.lower(User.email).in_(sorted(addresses)))
            .order_by(User.id)
        ):
            by_address.setdefault(address, []).append(user_id)
    return {
        e: [e.user_id]
        if e.user_id in existing and e.user_id is not None
        else by_address.get(e.address.lower(), [])[:MAX_USERS_PER_ADDRESS]
        for e in found
    }


def _needs_period(event: Event, user_id: int) -> bool:
    return not (event.user_id == user_id and event.period)


def _sent_periods(session: Session, wanted: list[tuple[int, Event]]) -> dict[tuple[int, Event], str | None]:
    """For each (user, event), the period of the user's latest monthly email sent before the event:
    the one it was about (``None`` when there is none in the recent periods)."""
    if not wanted:
        return {}
    recent = select(PeriodRun.period).order_by(PeriodRun.period.desc()).limit(PERIODS_SEARCHED)
    sent: dict[int, list[tuple[str, datetime]]] = {}
    for user_id, period, sent_at in session.execute(
        select(Delivery.user_id, Delivery.period, Delivery.sent_at).where(
            Delivery.user_id.in_(sorted({user for user, _ in wanted})),
            Delivery.period.in_(recent.scalar_subquery()),
            Delivery.state == DeliveryState.SENT,
        )
    ):
        if sent_at is not None:
            sent.setdefault(user_id, []).append((period, sent_at))
    return {
        (user, e): max(
            (period for period, at in sent.get(user, ()) if at <= e.occurred_at + _CLOCK_SLACK), default=None
        )
        for user, e in wanted
    }


def _suppress_if_soft_bounced(session: Session, event: Event, user_id: int, *, now: datetime, policy: Policy) -> bool:
    """Suppress ``user_id`` if its soft bounces reached the limit; ``True`` if this added the entry."""
    # Each user's soft bounces are counted under a lock on the user's row, so two bounces
    # arriving at once cannot both count one short of the limit.
    session.execute(select(User.id).where(User.id == user_id).with_for_update())
    soft = _soft_bounces(session, user_id, since=now - policy.soft_bounce_window)
    if soft < policy.soft_bounce_limit:
        return False
    return suppressions.add(
        session,
        user_id,
        SuppressionReason.BOUNCED,
        now=now,
        source=f"{event.provider} {soft} soft bounces in {policy.soft_bounce_window.days} days",
        provider=event.provider.value,
        event_id=event.event_id,
    )


def _soft_bounces(session: Session, user_id: int, *, since: datetime) -> int:
    # Once per email, told apart by the period it was about (each event by itself when it has
    # none): Mailgun reports a temporary failure on every one of its retries of one email, each an
    # event of its own, so three retries in half an hour would count as three soft-bounced emails.
    email = func.coalesce(FeedbackMatch.period, cast(FeedbackMatch.event, String))
    return (
        session.scalar(
            select(func.count(distinct(email)))
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
    """Events ever stored, pruned ones included, per (provider, kind), every pair present (0 when none)."""
    # One statement, so one snapshot: read in two, a prune committed between them would be counted
    # both as stored and as pruned, and the next scrape, lower, would read as a counter reset.
    stored = select(FeedbackEvent.provider, FeedbackEvent.kind, func.count().label("n")).group_by(
        FeedbackEvent.provider, FeedbackEvent.kind
    )
    pruned = select(FeedbackPruned.provider, FeedbackPruned.kind, FeedbackPruned.events.label("n"))
    both = union_all(stored, pruned).subquery()
    counts = {
        (str(p), str(k)): int(n)
        for p, k, n in session.execute(
            select(both.c.provider, both.c.kind, func.sum(both.c.n)).group_by(both.c.provider, both.c.kind)
        )
    }
    return {(p.value, k.value): counts.get((p.value, k.value), 0) for p in Provider for k in Kind}


def unmatched_by_provider(session: Session) -> dict[str, int]:
    """Events ever stored that matched no user, pruned ones included, per provider, every provider present."""
    no_match = ~select(FeedbackMatch.event).where(FeedbackMatch.event == FeedbackEvent.id).exists()
    # One statement, so one snapshot (see count_by_provider_kind).
    stored = select(FeedbackEvent.provider, func.count().label("n")).where(no_match).group_by(FeedbackEvent.provider)
    pruned = select(FeedbackPruned.provider, FeedbackPruned.unmatched.label("n"))
    both = union_all(stored, pruned).subquery()
    counts = {
        str(p): int(n)
        for p, n in session.execute(select(both.c.provider, func.sum(both.c.n)).group_by(both.c.provider))
    }
    return {p.value: counts.get(p.value, 0) for p in Provider}


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
