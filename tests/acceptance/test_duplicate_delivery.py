"""At-least-once delivery must never become a second email."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reports.clock import utcnow
from reports.fanout import coordinator, runs
from reports.fanout.progress import count
from reports.periods import Period
from reports.worker.broker import build_broker
from reports.worker.queues import RedisQueue
from tests.support.databases import load_users
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance


def test_every_message_enqueued_twice_side_by_side_still_mails_each_user_once(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=40, inactive_every=1000)
    period = Period(2026, 10)
    with sessions.begin() as session:
        runs.trigger(session, period, template_version="v1", now=utcnow())
    broker = build_broker(settings)

    class SendingEachTwice(RedisQueue):
        def send_jobs(self, spec, payloads):  # type: ignore[no-untyped-def]
            return super().send_jobs(spec, [p for payload in payloads for p in (payload, payload)])

    outcome = coordinator.walk_slice(sessions, period, SendingEachTwice(broker), page_size=7, budget_seconds=60)
    assert outcome.planned and outcome.enqueued == 2 * len(population.active)

    # Eight threads take adjacent copies of one message at the same moment.
    start_workers(settings, processes=2, threads=4)

    def complete():
        with sessions.begin() as session:
            return count(session, period).complete

    wait_until(complete, timeout=90, what="the period to complete")
    by_user = smtp_server.by_user()
    assert sorted(by_user) == population.active
    assert {user: len(messages) for user, messages in by_user.items() if len(messages) != 1} == {}
