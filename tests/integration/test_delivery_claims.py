"""Delivery claims on real databases: one holder at a time, leases that end, takeovers that win.

Leases run on the database's clock, so time is walked by moving a stored lease's end, as the
database's clock moving on would.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from reports.delivery import claims
from reports.errors import ClaimHeld
from reports.models import Delivery, DeliveryState
from reports.sql import server_now
from tests.integration.conftest import PERIOD, make_partitions

USER_ID = 42
LEASE = 30.0
T0 = datetime(2026, 11, 1, 12, 0, 0)
MESSAGE_ID = f"<report.{PERIOD}.{USER_ID}@reports.test>"


@pytest.fixture(autouse=True)
def _partitions(sessions) -> None:  # type: ignore[no-untyped-def]
    make_partitions(sessions)


def take(sessions) -> claims.Claim | None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        return claims.take(session, PERIOD, USER_ID, message_id=MESSAGE_ID, lease_seconds=LEASE)


def complete(sessions, claim: claims.Claim, now: datetime) -> bool:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        return claims.complete(session, claim, now=now)


def release(sessions, claim: claims.Claim) -> None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        claims.release(session, claim)


def lease_left(sessions, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Move the stored lease's end to ``seconds`` from now on the database's clock (negative: past)."""
    with sessions.begin() as session:
        session.execute(
            update(Delivery)
            .where(Delivery.period == str(PERIOD), Delivery.user_id == USER_ID)
            .values(lease_expires_at=server_now(seconds))
        )


def database_now(sessions) -> datetime:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return session.scalar(select(server_now()))


def stored(sessions) -> Delivery:  # type: ignore[no-untyped-def]
    with sessions() as session:
        row = session.get(Delivery, (str(PERIOD), USER_ID))
        assert row is not None
        return row


def test_the_first_take_claims_the_delivery_for_a_lease_on_the_databases_clock(sessions):
    before = database_now(sessions)
    claim = take(sessions)
    after = database_now(sessions)

    assert claim is not None
    assert (claim.period, claim.user_id) == (PERIOD, USER_ID)
    row = stored(sessions)
    assert row.state == DeliveryState.CLAIMED
    assert row.claim_token == claim.token
    assert row.message_id == MESSAGE_ID
    assert before <= row.claimed_at <= after
    assert (row.lease_expires_at - row.claimed_at).total_seconds() == pytest.approx(LEASE, abs=0.01)


def test_a_second_take_while_the_lease_runs_is_told_how_long_to_wait(sessions):
    first = take(sessions)
    assert first is not None
    lease_left(sessions, LEASE - 10)

    with pytest.raises(ClaimHeld) as held:
        take(sessions)

    assert held.value.retry_after_seconds == pytest.approx(LEASE - 10, abs=0.5)
    assert stored(sessions).claim_token == first.token


def test_a_take_at_the_very_end_of_the_lease_is_still_refused_one_second_before(sessions):
    assert take(sessions) is not None
    lease_left(sessions, 1)

    with pytest.raises(ClaimHeld) as held:
        take(sessions)

    assert held.value.retry_after_seconds == pytest.approx(1.0, abs=0.5)


def test_after_the_lease_expires_a_second_take_takes_over_and_the_first_cannot_complete(sessions):
    first = take(sessions)
    assert first is not None
    lease_left(sessions, -1)

    second = take(sessions)

    assert second is not None
    assert second.token != first.token
    assert complete(sessions, first, T0 + timedelta(seconds=LEASE + 2)) is False
    assert stored(sessions).state == DeliveryState.CLAIMED
    assert complete(sessions, second, T0 + timedelta(seconds=LEASE + 3)) is True
    row = stored(sessions)
    assert row.state == DeliveryState.SENT
    assert row.times_taken == 2
    assert row.sent_at == T0 + timedelta(seconds=LEASE + 3)


def test_once_completed_a_take_returns_none_even_after_the_lease(sessions):
    claim = take(sessions)
    assert claim is not None
    assert complete(sessions, claim, T0 + timedelta(seconds=1)) is True

    assert take(sessions) is None
    lease_left(sessions, -24 * 3600)
    assert take(sessions) is None
    assert stored(sessions).state == DeliveryState.SENT


def test_a_released_claim_can_be_retaken_at_once(sessions):
    claim = take(sessions)
    assert claim is not None

    release(sessions, claim)
    retaken = take(sessions)

    assert retaken is not None
    assert retaken.token != claim.token
    assert stored(sessions).claim_token == retaken.token


def test_releasing_a_claim_that_was_taken_over_does_not_free_the_new_holder(sessions):
    first = take(sessions)
    assert first is not None
    lease_left(sessions, -1)
    second = take(sessions)
    assert second is not None

    release(sessions, first)

    with pytest.raises(ClaimHeld):
        take(sessions)
