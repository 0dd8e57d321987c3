"""The oldest ready message's age on Redis, as the exporter reads it, for a message that waited out a
delay (a retry's backoff, a deferral): counted from when it came due, not from its first enqueue,
which Dramatiq's copies keep through every retry."""

from __future__ import annotations

import time

import dramatiq
from sqlalchemy.orm import Session, sessionmaker

from reports.jobs import SEND_NOW
from reports.settings import Settings
from reports.worker.broker import build_broker
from tests.integration.test_metrics_period_gauges import gauge, redis_collector

QUARTER_HOUR_MS = 15 * 60 * 1000


def test_a_message_deferred_for_a_quarter_of_an_hour_is_as_old_as_the_time_since_it_came_due(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    broker = build_broker(settings)
    now_ms = int(time.time() * 1000)
    # First enqueued a quarter of an hour ago; due again (its deferral's eta) ten seconds ago.
    deferred: dramatiq.Message[None] = dramatiq.Message(
        queue_name=SEND_NOW.queue,
        actor_name=SEND_NOW.name,
        args=(),
        kwargs={},
        options={"eta": now_ms - 10_000},
        message_timestamp=now_ms - QUARTER_HOUR_MS,
    )
    broker.enqueue(deferred)
    collector = redis_collector(settings, sessions, SEND_NOW.queue)

    age = gauge(collector, "reports_queue_oldest_message_age_seconds")[(SEND_NOW.queue,)]

    assert 10 <= age < 60, age
    broker.close()
