"""The metrics reference names what the exporter serves: the families the docs read from
reports/ops/metrics.py's source are the ones a real collection yields, with the same type and labels."""

from __future__ import annotations

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from reports.delivery.breaker import mail_breaker_name
from reports.jobs import BUILD_REPORT, COORDINATOR, SEND_NOW
from reports.ops.metrics import ReportsCollector
from reports.settings import Settings
from tests.support import docs


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_documented_metric_families_are_what_a_collection_yields(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    hook = docs.load("docs/hooks/reference.py")
    client = redis.Redis.from_url(settings.broker_url)
    try:
        collector = ReportsCollector(
            client,
            namespace=settings.broker_namespace,
            sessions=sessions,
            queues=(SEND_NOW.queue, COORDINATOR.queue, BUILD_REPORT.queue),
            breaker_name=mail_breaker_name(settings.broker_namespace),
        )
        collected = {(m.name, m.type) for m in collector.collect()}
    finally:
        client.close()
    documented = {(family["name"], family["type"]) for family in hook.metric_families()}
    assert documented == collected
