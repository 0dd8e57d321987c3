"""The coordinator pauses while the bulk queue holds its high-water mark, so the broker stays bounded."""

from __future__ import annotations

import pytest
import redis

from reports.clock import utcnow
from reports.fanout import coordinator, runs
from reports.fanout.progress import count
from reports.jobs import BUILD_REPORT
from reports.periods import Period
from reports.worker.queues import queue_for
from tests.support.databases import load_users
from tests.support.sqs import take_all

PERIOD = Period(2026, 10)


def _walk(sessions, broker, *, high_water: int):
    return coordinator.walk_slice(
        sessions,
        PERIOD,
        queue_for(broker),
        page_size=7,
        budget_seconds=60,
        high_water=high_water,
    )


def _drain(settings) -> None:
    """What the consumers do: take every message off the bulk queue."""
    if settings.broker_is_sqs:
        take_all(settings.broker_url, "bulk")
        return
    client = redis.Redis.from_url(settings.broker_url)
    client.delete(f"{settings.broker_namespace}:bulk", f"{settings.broker_namespace}:bulk.msgs")


# On SQS the mark reads SQS's own counts of the queue (ready, delayed, in flight).
@pytest.mark.parametrize("broker_kind", ["redis", "sqs"], indirect=True)
def test_the_walk_pauses_at_the_high_water_mark_and_resumes_below_it(settings, sessions, broker):
    population = load_users(sessions, count=30, inactive_every=1000)
    with sessions.begin() as session:
        runs.trigger(session, PERIOD, template_version="v1", now=utcnow())

    # A backlog already at the mark: nothing is recorded or enqueued.
    queue_for(broker).send_jobs(BUILD_REPORT, [{"period": "2026-10", "user_id": 1, "template_version": "v1"}] * 10)
    paused = _walk(sessions, broker, high_water=10)
    assert (paused.backlogged, paused.pages, paused.planned) == (True, 0, False)
    assert queue_for(broker).backlog(BUILD_REPORT.queue) == 10

    # Below the mark the walk goes on, one page at a time, until the backlog reaches it again.
    _drain(settings)
    partial = _walk(sessions, broker, high_water=10)
    assert (partial.backlogged, partial.pages, partial.planned) == (True, 2, False)
    assert queue_for(broker).backlog(BUILD_REPORT.queue) == 14
    with sessions.begin() as session:
        assert count(session, PERIOD).total == 14

    # Consumers drained it: the walk finishes from its checkpoint, every user once.
    _drain(settings)
    done = _walk(sessions, broker, high_water=1000)
    assert done.planned and not done.backlogged
    with sessions.begin() as session:
        final = count(session, PERIOD)
    assert (final.total, final.planned) == (len(population.active), True)
    assert queue_for(broker).backlog(BUILD_REPORT.queue) == len(population.active) - 14
