"""Delivery claims: the gate that turns at-least-once messages into at-most-one email.

A copy of a message must claim (period, user) before it hands the email to the provider. The
claim carries a lease, so a copy whose worker died after claiming blocks the email only until
the lease runs out; then a later copy takes the claim over and sends. Leases are written and
compared on the database server's clock (:func:`reports.sql.server_now`), never a worker's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from reports.errors import ClaimHeld
from reports.models import Delivery, DeliveryState, ItemState, SendNowRequest
from reports.periods import Period
from reports.sql import Executor, insert_ignoring_conflicts, rowcount, server_now

#: Claim states a send may take over once their lease has run out.
TAKEABLE = (DeliveryState.REQUESTED, DeliveryState.CLAIMED)


@dataclass(frozen=True)
class Claim:
    period: Period
    user_id: int
    token: str
    #: ``None`` for the monthly email; the request's id for a ``send-now``.
    request_id: str | None = None

    @property
    def _model(self) -> type[Delivery | SendNowRequest]:
        return Delivery if self.request_id is None else SendNowRequest

    def _key(self) -> list[Any]:
        if self.request_id is None:
            return [Delivery.period == str(self.period), Delivery.user_id == self.user_id]
        return [SendNowRequest.request_id == self.request_id]


def new_token() -> str:
    """A claim's token: random, so only its holder can complete it."""
    return str(uuid.uuid4())


def take(session: Executor, period: Period, user_id: int, *, message_id: str, lease_seconds: float) -> Claim | None:
    """Claim the right to send the monthly email; ``None`` when it was already sent.

    Raises :class:`ClaimHeld` while another copy's lease is still running.
    """
    return _take(session, Claim(period, user_id, new_token()), message_id=message_id, lease_seconds=lease_seconds)


def record_send_now_request(
    session: Session,
    request_id: str,
    period: Period,
    user_id: int,
    *,
    message_id: str,
    template_version: str,
    now: datetime,
) -> None:
    """Write a ``send-now`` request when it is made, before its message exists: if the message is
    lost, reconcile finds the request and sends it again."""
    session.execute(
        insert_ignoring_conflicts(session, SendNowRequest.__table__).values(
            request_id=request_id,
            period=str(period),
            user_id=user_id,
            requested_at=now,
            updated_at=now,
            template_version=template_version,
            state=DeliveryState.REQUESTED,
            message_id=message_id,
            claim_token="",
            # Ended: the first copy of the message takes it at once.
            lease_expires_at=server_now(),
            times_taken=0,
            claimed_at=server_now(),
        )
    )


def take_send_now_request(
    session: Session,
    request_id: str,
    period: Period,
    user_id: int,
    *,
    message_id: str,
    template_version: str,
    lease_seconds: float,
    now: datetime,
) -> Claim | None:
    """Claim the right to send for one ``send-now`` request; ``None`` when that request was served.

    ``now`` stamps the request (``requested_at``, ``updated_at``); its lease is on the database's clock.
    """
    return _take(
        session,
        Claim(period, user_id, new_token(), request_id),
        message_id=message_id,
        lease_seconds=lease_seconds,
        extra={"requested_at": now, "updated_at": now, "template_version": template_version},
        touched={"updated_at": now},
    )


def _take(
    session: Executor,
    claim: Claim,
    *,
    message_id: str,
    lease_seconds: float,
    extra: dict[str, Any] | None = None,
    touched: dict[str, Any] | None = None,
) -> Claim | None:
    model = claim._model
    lease_expires_at = server_now(lease_seconds)
    key_values = {"period": str(claim.period), "user_id": claim.user_id}
    if claim.request_id is not None:
        key_values["request_id"] = claim.request_id
    # RETURNING, not rowcount: drivers disagree on rowcount for ON CONFLICT DO NOTHING.
    inserted = (
        session.execute(
            insert_ignoring_conflicts(session, model.__table__)
            .values(
                **key_values,
                **(extra or {}),
                state=DeliveryState.CLAIMED,
                message_id=message_id,
                claim_token=claim.token,
                lease_expires_at=lease_expires_at,
                times_taken=1,
                claimed_at=server_now(),
            )
            .returning(model.__table__.c.user_id)
        ).first()
        is not None
    )
    if not inserted:
        # A recorded request, or a claim whose holder's lease ran out: take it over.
        inserted = (
            rowcount(
                session.execute(
                    update(model)
                    .where(*claim._key(), model.state.in_(TAKEABLE), model.lease_expires_at <= server_now())
                    .values(
                        state=DeliveryState.CLAIMED,
                        claim_token=claim.token,
                        lease_expires_at=lease_expires_at,
                        times_taken=model.times_taken + 1,
                        claimed_at=server_now(),
                        **(touched or {}),
                    )
                    .execution_options(synchronize_session=False)
                )
            )
            > 0
        )
    if inserted:
        return claim
    not_taken(session, claim)
    return None


def not_taken(session: Executor, claim: Claim) -> None:
    """Why ``claim`` was not taken: returns when its email went out (or the request died); raises
    :class:`ClaimHeld` while another copy's lease runs."""
    model = claim._model
    state, expires, now = session.execute(
        select(model.state, model.lease_expires_at, server_now()).where(*claim._key())
    ).one()
    if state not in (DeliveryState.SENT, DeliveryState.DEAD):
        raise ClaimHeld(retry_after_seconds=max((expires - now).total_seconds(), 0.0))


def monthly_may_follow(*, planned: bool | None, item_state: str | None) -> bool:
    """Whether the monthly email of a (period, user) may still go out, so that a ``send-now``
    that finds it unsent is that email rather than one of its own.

    :param planned: whether the period's walk is done; ``None`` for a period never triggered.
    :param item_state: the state of the user's item; ``None`` when there is none.

    An item says: pending, or dead (a replay may send it); delivered or skipped, settled. With
    none, only a walk yet to come can record one: after a walk that is done, the user was not
    planned or their item was pruned, and a pruned period's deliveries are gone, so the claim
    would wrongly read as never sent.
    """
    if item_state is not None:
        return item_state in (ItemState.PENDING, ItemState.DEAD)
    return not planned


def is_sent(session: Session, period: Period, user_id: int) -> bool:
    """Whether the monthly email of (period, user) went out."""
    return (
        session.scalar(select(Delivery.state).where(Delivery.period == str(period), Delivery.user_id == user_id))
        == DeliveryState.SENT
    )


def complete(session: Executor, claim: Claim, *, now: datetime) -> bool:
    """Record the send; ``False`` if this claim had been taken over meanwhile (its lease ran out)."""
    model = claim._model
    return bool(
        rowcount(
            session.execute(
                update(model)
                .where(*claim._key(), model.claim_token == claim.token)
                .values(state=DeliveryState.SENT, sent_at=now)
                .execution_options(synchronize_session=False)
            )
        )
    )


def release(session: Executor, claim: Claim) -> None:
    """End a claim's lease early after a send that failed, so the retry need not wait it out."""
    model = claim._model
    session.execute(
        update(model)
        .where(*claim._key(), model.claim_token == claim.token, model.state == DeliveryState.CLAIMED)
        .values(lease_expires_at=server_now())
        .execution_options(synchronize_session=False)
    )
