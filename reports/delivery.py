"""Delivery claims: the gate that turns at-least-once messages into at-most-one email.

A copy of a message must claim (period, user) before it hands the email to the provider. The
claim carries a lease, so a copy whose worker died after claiming blocks the email only until
the lease runs out; then a later copy takes the claim over and sends.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from reports.errors import ClaimHeld
from reports.models import Delivery, DeliveryState
from reports.periods import Period
from reports.sql import insert_ignoring_conflicts


@dataclass(frozen=True)
class Claim:
    period: Period
    user_id: int
    token: str


def take(
    session: Session, period: Period, user_id: int, *, message_id: str, lease_seconds: float, now: datetime
) -> Claim | None:
    """Claim the right to send; ``None`` when the email was already sent.

    Raises :class:`ClaimHeld` while another copy's lease is still running.
    """
    token = str(uuid.uuid4())
    lease_expires_at = now + timedelta(seconds=lease_seconds)
    key = (Delivery.period == str(period), Delivery.user_id == user_id)
    # RETURNING, not rowcount: drivers disagree on rowcount for ON CONFLICT DO NOTHING.
    inserted = session.execute(
        insert_ignoring_conflicts(session, Delivery.__table__)
        .values(
            period=str(period), user_id=user_id, state=DeliveryState.CLAIMED, message_id=message_id,
            claim_token=token, lease_expires_at=lease_expires_at, claims=1, claimed_at=now,
        )
        .returning(Delivery.__table__.c.user_id)
    ).first() is not None
    if not inserted:
        inserted = session.execute(
            update(Delivery)
            .where(*key, Delivery.state == DeliveryState.CLAIMED, Delivery.lease_expires_at <= now)
            .values(claim_token=token, lease_expires_at=lease_expires_at, claims=Delivery.claims + 1, claimed_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount
    if inserted:
        return Claim(period, user_id, token)
    state, expires = session.execute(select(Delivery.state, Delivery.lease_expires_at).where(*key)).one()
    if state == DeliveryState.SENT:
        return None
    raise ClaimHeld(retry_after_seconds=max((expires - now).total_seconds(), 0.0))


def complete(session: Session, claim: Claim, *, now: datetime) -> bool:
    """Record the send; ``False`` if this claim had been taken over meanwhile (its lease ran out)."""
    return bool(
        session.execute(
            update(Delivery)
            .where(
                Delivery.period == str(claim.period),
                Delivery.user_id == claim.user_id,
                Delivery.claim_token == claim.token,
            )
            .values(state=DeliveryState.SENT, sent_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount
    )


def release(session: Session, claim: Claim, *, now: datetime) -> None:
    """End a claim's lease early after a send that failed, so the retry need not wait it out."""
    session.execute(
        update(Delivery)
        .where(
            Delivery.period == str(claim.period),
            Delivery.user_id == claim.user_id,
            Delivery.claim_token == claim.token,
            Delivery.state == DeliveryState.CLAIMED,
        )
        .values(lease_expires_at=now)
        .execution_options(synchronize_session=False)
    )
