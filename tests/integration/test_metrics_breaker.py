"""The exporter's breaker figures: every state the breaker can enter is a counter from 0, so its
first entry into a state is an increase Prometheus can see."""

from __future__ import annotations

import redis
from sqlalchemy.orm import Session, sessionmaker

from reports import counters
from reports.delivery.breaker import State
from reports.jobs import BUILD_REPORT
from reports.settings import Settings
from tests.integration.test_metrics_period_gauges import gauge, redis_collector


def test_every_breaker_state_is_counted_from_zero_before_the_breaker_ever_changes(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    collector = redis_collector(settings, sessions, BUILD_REPORT.queue)

    assert gauge(collector, "reports_breaker_transitions") == {("mail", str(state)): 0.0 for state in State}

    counters.count(
        redis.Redis.from_url(settings.broker_url), settings.broker_namespace, "breaker_transitions", "mail", "open"
    )
    assert gauge(collector, "reports_breaker_transitions") == {
        ("mail", "closed"): 0.0,
        ("mail", "open"): 1.0,
        ("mail", "half_open"): 0.0,
    }
