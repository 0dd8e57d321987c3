"""The per-period gauges of the exporter: a cancelled period says so next to its item counts."""

from __future__ import annotations

import redis
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.delivery.breaker import mail_breaker_name
from reports.fanout import runs
from reports.jobs import BUILD_REPORT
from reports.ops.metrics import ReportsCollector
from reports.settings import Settings
from tests.integration.conftest import PERIOD, trigger


def redis_collector(settings: Settings, sessions: sessionmaker[Session], *queues: str) -> ReportsCollector:
    """The exporter's collector on the Redis broker of ``settings``."""
    return ReportsCollector(
        redis.Redis.from_url(settings.broker_url),
        namespace=settings.broker_namespace,
        sessions=sessions,
        queues=queues,
        breaker_name=mail_breaker_name(settings.broker_namespace),
    )


def gauge(collector: ReportsCollector, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sample.labels.values()): sample.value
        for family in collector.collect()
        if family.name == name
        for sample in family.samples
    }


def test_a_cancelled_period_reads_cancelled_and_keeps_its_item_counts(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    trigger(sessions, settings)
    collector = redis_collector(settings, sessions, BUILD_REPORT.queue)
    assert gauge(collector, "reports_period_cancelled") == {(str(PERIOD),): 0.0}

    with sessions.begin() as session:
        runs.cancel(session, PERIOD, now=utcnow())

    assert gauge(collector, "reports_period_cancelled") == {(str(PERIOD),): 1.0}
    items = gauge(collector, "reports_period_items")
    assert set(items) == {(str(PERIOD), state) for state in ("pending", "delivered", "skipped", "dead")}
