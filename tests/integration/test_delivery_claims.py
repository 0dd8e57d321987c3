"""Delivery claims on real databases: one holder at a time, leases that end, takeovers that win."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from reports.delivery import claims
from reports.errors import ClaimHeld
from reports.models import Delivery, DeliveryState
from tests.integration.conftest import PERIOD

USER_ID = 42
LEASE = 30.0
T0 = datetime(2026, 11, 1, 12, 0, 0)
MESSAGE_ID = f"<report.{PERIOD}.{USER_ID}@reports.test>"


def take(sessions, now: datetime) -> claims.Claim | None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        return claims.take(session, PERIOD, USER_ID, message_id=MESSAGE_ID, lease_seconds=LEASE, now=now)


def complete(sessions, claim: claims.Claim, now: datetime) -> bool:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        return claims.complete(session, claim, now=now)


def release(sessions, claim: claims.Claim, now: datetime) -> None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        claims.release(session, claim, now=now)


def stored(sessions) -> Delivery:  # type: ignore[no-untyped-def]
    with sessions() as session:
        row = session.get(Delivery, (str(PERIOD), USER_ID))
        assert row is not None
        return row


def test_the_first_take_claims_the_delivery(sessions):
    claim = take(sessions, T0)

    assert claim is not None
    assert (claim.period, claim.user_id) == (PERIOD, USER_ID)
    row = stored(sessions)
    assert row.state == DeliveryState.CLAIMED
    assert row.claim_token == claim.token
    assert row.message_id == MESSAGE_ID
    assert row.lease_expires_at == T0 + timedelta(seconds=LEASE)


def test_a_second_take_while_the_lease_runs_is_told_how_long_to_wait(sessions):
    first = take(sessions, T0)
    assert first is not None

    with pytest.raises(ClaimHeld) as held:
        take(sessions, T0 + timedelta(seconds=10))

    assert held.value.retry_after_seconds == pytest.approx(LEASE - 10, abs=0.01)
    assert stored(sessions).claim_token == first.token


def test_a_take_at_the_very_end_of_the_lease_is_still_refused_one_second_before(sessions):
    assert take(sessions, T0) is not None

    with pytest.raises(ClaimHeld) as held:
        take(sessions, T0 + timedelta(seconds=LEASE - 1))

    assert held.value.retry_after_seconds == pytest.approx(1.0, abs=0.01)


def test_after_the_lease_expires_a_second_take_takes_over_and_the_first_cannot_complete(sessions):
    first = take(sessions, T0)
    assert first is not None

    second = take(sessions, T0 + timedelta(seconds=LEASE + 1))

    assert second is not None
    assert second.token != first.token
    assert complete(sessions, first, T0 + timedelta(seconds=LEASE + 2)) is False
    assert stored(sessions).state == DeliveryState.CLAIMED
    assert complete(sessions, second, T0 + timedelta(seconds=LEASE + 3)) is True
    row = stored(sessions)
    assert row.state == DeliveryState.SENT
    assert row.claims == 2
    assert row.sent_at == T0 + timedelta(seconds=LEASE + 3)


def test_once_completed_a_take_returns_none_even_after_the_lease(sessions):
    claim = take(sessions, T0)
    assert claim is not None
    assert complete(sessions, claim, T0 + timedelta(seconds=1)) is True

    assert take(sessions, T0 + timedelta(seconds=2)) is None
    assert take(sessions, T0 + timedelta(days=1)) is None
    assert stored(sessions).state == DeliveryState.SENT


def test_a_released_claim_can_be_retaken_at_once(sessions):
    claim = take(sessions, T0)
    assert claim is not None

    release(sessions, claim, T0 + timedelta(seconds=1))
    retaken = take(sessions, T0 + timedelta(seconds=1))

    assert retaken is not None
    assert retaken.token != claim.token
    assert stored(sessions).claim_token == retaken.token


def test_releasing_a_claim_that_was_taken_over_does_not_free_the_new_holder(sessions):
    first = take(sessions, T0)
    assert first is not None
    second = take(sessions, T0 + timedelta(seconds=LEASE + 1))
    assert second is not None

    release(sessions, first, T0 + timedelta(seconds=LEASE + 2))

    with pytest.raises(ClaimHeld):
        take(sessions, T0 + timedelta(seconds=LEASE + 2))
