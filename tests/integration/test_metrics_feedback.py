"""The exporter's provider-feedback figures: events by provider and kind from the stored events,
unmatched events, and each period's complaint and bounce rates over its delivered emails."""

from __future__ import annotations

from datetime import timedelta

import redis
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.delivery.breaker import mail_breaker_name
from reports.feedback import store
from reports.feedback.events import Event, Kind, Provider
from reports.jobs import BUILD_REPORT
from reports.ops.metrics import ReportsCollector
from reports.settings import Settings
from tests.integration.conftest import PERIOD, walk_everything
from tests.integration.test_metrics_period_gauges import gauge
from tests.support.databases import load_users


def test_complaint_and_bounce_rates_per_period_and_events_by_provider_and_kind(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    load_users(sessions, count=40, inactive_every=1000)
    walk_everything(sessions, settings)
    collector = ReportsCollector(
        redis.Redis.from_url(settings.broker_url),
        namespace=settings.broker_namespace,
        sessions=sessions,
        queues=(BUILD_REPORT.queue,),
        breaker_name=mail_breaker_name(settings.broker_namespace),
    )
    events = gauge(collector, "reports_feedback_events")
    assert len(events) == len(Provider) * len(Kind) and set(events.values()) == {0.0}
    # Nothing delivered yet: no rate (0 of 0 is no figure to alert on).
    assert gauge(collector, "reports_period_complaint_rate") == {}

    with sessions.begin() as session:
        session.execute(text("UPDATE report_items SET state = 'delivered' WHERE period = :p"), {"p": str(PERIOD)})
        found = [
            Event(Provider.SES, f"c{u}", Kind.COMPLAINT, f"user{u}@example.test", utcnow(), "abuse", u, str(PERIOD))
            for u in (1, 2)
        ]
        found.append(
            Event(Provider.MAILGUN, "b1", Kind.HARD_BOUNCE, "user3@example.test", utcnow(), "x", 3, str(PERIOD))
        )
        found.append(
            Event(Provider.MAILGUN, "s1", Kind.SOFT_BOUNCE, "user4@example.test", utcnow(), "x", 4, str(PERIOD))
        )
        found.append(Event(Provider.SENDGRID, "u1", Kind.HARD_BOUNCE, "stranger@example.test", utcnow(), "x"))
        store.record(
            session, found, now=utcnow(), policy=store.Policy(soft_bounce_limit=3, soft_bounce_window=timedelta(days=1))
        )

    period = (str(PERIOD),)
    assert gauge(collector, "reports_period_complaints") == {period: 2.0}
    assert gauge(collector, "reports_period_complaint_rate") == {period: 2 / 40}
    assert gauge(collector, "reports_period_bounces") == {period: 1.0}
    assert gauge(collector, "reports_period_bounce_rate") == {period: 1 / 40}
    events = gauge(collector, "reports_feedback_events")
    assert events[("ses", "complaint")] == 2.0
    assert events[("mailgun", "hard_bounce")] == events[("mailgun", "soft_bounce")] == 1.0
    assert gauge(collector, "reports_feedback_unmatched_events")[("sendgrid",)] == 1.0

    # A false complaint dismissed no longer counts against the period.
    with sessions.begin() as session:
        store.dismiss(session, 1, now=utcnow())
    assert gauge(collector, "reports_period_complaint_rate") == {period: 1 / 40}
