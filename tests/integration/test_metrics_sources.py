"""The exporter's sources, each read on its own: one that is down leaves the others' figures (and
the alerts on them) standing, and ``reports_exporter_source_up`` says which is missing; a Redis
broker's queues are read from the broker, not from REDIS_URL's Redis."""

from __future__ import annotations

from dataclasses import replace

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from reports.database import create_db_engine, session_factory
from reports.jobs import BUILD_REPORT
from reports.ops.metrics import fleet_collector
from reports.settings import Settings
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for
from tests.integration.conftest import PERIOD, trigger, walk_everything
from tests.support.databases import load_users
from tests.support.processes import free_port

Figures = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def collect(settings: Settings, sessions: sessionmaker[Session]) -> Figures:
    collector = fleet_collector(replace(settings, exporter_cache_seconds=0), sessions)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in collector.collect()
        for sample in family.samples
    }


def sources(figures: Figures) -> dict[str, float]:
    return {
        dict(labels)["source"]: value
        for (name, labels), value in figures.items()
        if name == "reports_exporter_source_up"
    }


def names(figures: Figures) -> set[str]:
    return {name for name, _labels in figures}


def test_with_redis_down_the_database_figures_are_still_served(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    load_users(sessions, count=3)
    trigger(sessions, settings)
    nowhere = f"redis://127.0.0.1:{free_port()}/0"

    figures = collect(replace(settings, broker_url=nowhere), sessions)

    assert sources(figures) == {"broker": 0.0, "redis": 0.0, "database": 1.0}
    assert figures[("reports_period_planned", (("period", str(PERIOD)),))] == 0.0
    assert "reports_breaker_state" not in names(figures)
    assert "reports_queue_messages" not in names(figures)


def test_with_the_database_down_the_queues_and_the_breaker_are_still_served(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    load_users(sessions, count=3)
    walk_everything(sessions, settings, queue=queue_for(build_broker(settings)))
    gone = session_factory(create_db_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none"))

    figures = collect(settings, gone)

    assert sources(figures) == {"broker": 1.0, "redis": 1.0, "database": 0.0}
    assert figures[("reports_queue_messages", (("queue", BUILD_REPORT.queue), ("state", "ready")))] == 3
    assert figures[("reports_breaker_state", (("breaker", "mail"),))] == 0.0
    assert not any(name.startswith("reports_period_") for name in names(figures))


def test_a_redis_broker_apart_from_redis_url_has_its_queues_read_from_the_broker(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    load_users(sessions, count=4)
    shared_url = settings.broker_url.rsplit("/", 1)[0] + "/9"
    shared = redis.Redis.from_url(shared_url)
    apart = replace(settings, redis_url=shared_url)
    try:
        walk_everything(sessions, apart, queue=queue_for(build_broker(apart)))

        figures = collect(apart, sessions)

        assert sources(figures) == {"broker": 1.0, "redis": 1.0, "database": 1.0}
        assert figures[("reports_queue_messages", (("queue", BUILD_REPORT.queue), ("state", "ready")))] == 4
    finally:
        keys = list(shared.scan_iter(match=f"{settings.broker_namespace}:*"))
        if keys:
            shared.delete(*keys)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_on_rabbitmq_with_the_shared_redis_down_the_brokers_own_counts_are_still_served(
    settings: Settings, sessions: sessionmaker[Session], rabbitmq_url: str
) -> None:
    load_users(sessions, count=3)
    on_rabbitmq = replace(settings, broker_url=rabbitmq_url, redis_url=settings.broker_url)
    broker = build_broker(on_rabbitmq)
    try:
        walk_everything(sessions, on_rabbitmq, queue=queue_for(broker))
    finally:
        broker.close()

    figures = collect(replace(on_rabbitmq, redis_url=f"redis://127.0.0.1:{free_port()}/0"), sessions)

    assert sources(figures) == {"broker": 1.0, "redis": 0.0, "database": 1.0}
    assert figures[("reports_queue_messages", (("queue", BUILD_REPORT.queue), ("state", "ready")))] == 3
    # What the workers hold is in the shared Redis: unknown, so left out rather than shown as 0.
    assert ("reports_queue_messages", (("queue", BUILD_REPORT.queue), ("state", "in_progress"))) not in figures
