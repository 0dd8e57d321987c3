"""The brake on a month-wide rejection, on a real Redis: who trips it, and what a refusal after the trip is told."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from reports.delivery.brake import Brake, Tripped
from reports.periods import Period

PERIOD = Period.parse("2026-11")
THRESHOLD = 3
REPLY = "552 5.3.4 message file too big"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def brake(client: redis.Redis, namespace: str, window_seconds: float = 60) -> Brake:
    return Brake(client, namespace=namespace, threshold=THRESHOLD, window_seconds=window_seconds)


def refuse(brake: Brake, *user_ids: int, period: Period = PERIOD) -> list[Tripped | None]:
    now_ms = time.time() * 1000
    return [brake.note(period, user_id, REPLY, now_ms=now_ms) for user_id in user_ids]


def test_the_threshold_th_different_user_trips_it_and_a_user_refused_twice_counts_once(client, broker_namespace):
    guard = brake(client, broker_namespace)

    assert refuse(guard, 1, 1, 2, 2) == [None] * 4
    assert refuse(guard, 3) == [Tripped(PERIOD, THRESHOLD, 60, REPLY)]


def test_a_refusal_after_the_trip_is_told_how_long_it_holds_and_is_not_counted(client, broker_namespace):
    guard = brake(client, broker_namespace)
    refuse(guard, 1, 2, 3)

    [after] = refuse(guard, 4)

    assert after is not None and after.failures == THRESHOLD
    assert after.holds_for_seconds is not None and 59 < after.holds_for_seconds <= 60
    # Another month is counted on its own.
    assert refuse(guard, 4, period=PERIOD.previous()) == [None]


def test_once_the_trip_has_run_out_the_count_starts_afresh(client, broker_namespace):
    guard = brake(client, broker_namespace, window_seconds=0.3)
    refuse(guard, 1, 2, 3)
    assert refuse(guard, 4)[0].holds_for_seconds is not None  # type: ignore[union-attr]

    time.sleep(0.4)

    assert refuse(guard, 4, 5) == [None, None]
    assert refuse(guard, 6) == [Tripped(PERIOD, THRESHOLD, 0.3, REPLY)]
