"""Scrapes of the exporter cannot load the database: figures are collected at most once per window.

A real database (statements counted on the real engine), a real Redis, and the real HTTP server
of ``prometheus_client``, scraped over HTTP as Prometheus would.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from reports import counters
from reports.delivery.breaker import mail_breaker_name
from reports.jobs import BUILD_REPORT
from reports.ops.metrics import CachedCollector, ReportsCollector
from reports.settings import Settings
from tests.support.processes import free_port

#: The cache window of these tests, in seconds: long enough that ten scrapes fit in it.
WINDOW_SECONDS = 2.0


class StatementCount:
    """Counts the statements the engine behind ``sessions`` sends to the database."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.engine = sessions.kw["bind"]
        self.value = 0
        self._lock = threading.Lock()
        event.listen(self.engine, "before_cursor_execute", self._count)

    def _count(self, *_args: object) -> None:
        with self._lock:
            self.value += 1

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._count)


@pytest.fixture
def statements(sessions: sessionmaker[Session]) -> Iterator[StatementCount]:
    counter = StatementCount(sessions)
    yield counter
    counter.close()


@pytest.fixture
def scrape(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[Callable[[], float]]:
    """Serve the exporter's registry over HTTP; each call scrapes it and returns the dead-letter count."""
    client = redis.Redis.from_url(settings.broker_url)
    collector = ReportsCollector(
        client,
        namespace=settings.broker_namespace,
        sessions=sessions,
        queues=(BUILD_REPORT.queue,),
        breaker_name=mail_breaker_name(settings.broker_namespace),
    )
    registry = CollectorRegistry()
    registry.register(CachedCollector(collector, max_age_seconds=WINDOW_SECONDS))
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def dead_letters() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "reports_dead_letters_total"
        )

    yield dead_letters
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
    client.close()


def count_a_dead_letter(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.broker_url)
    counters.count(client, settings.broker_namespace, "dead_letters", "bulk", "build_report", "permanent")
    client.close()


def test_scrapes_within_the_window_cause_one_collection_and_the_next_window_sees_new_figures(
    settings, sessions, statements, scrape
):
    began = time.monotonic()
    assert scrape() == 0
    # The collection is stamped between the two: the window ends after ``began`` and by ``collected``.
    collected = time.monotonic()
    per_collection = statements.value
    assert per_collection > 0

    count_a_dead_letter(settings)
    seen = [scrape() for _ in range(10)]
    assert time.monotonic() - began < WINDOW_SECONDS, "the scrapes took longer than the window"
    assert statements.value == per_collection  # served from the one collection
    assert seen == [0] * 10

    time.sleep(WINDOW_SECONDS - (time.monotonic() - collected) + 0.1)
    assert scrape() == 1
    assert statements.value == 2 * per_collection


def test_concurrent_scrapes_share_one_collection(settings, sessions, statements, scrape):
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: scrape(), range(16)))

    assert results == [0] * 16
    single = statements.value
    time.sleep(WINDOW_SECONDS + 0.1)
    scrape()
    assert statements.value == 2 * single  # the sixteen scrapes ran the statements of one collection


def test_the_exporter_counts_suppressed_users_by_reason(settings, sessions):
    from reports import suppressions
    from reports.clock import utcnow
    from reports.models import SuppressionReason
    from tests.support.databases import load_users

    load_users(sessions, count=4)
    with sessions.begin() as session:
        for user_id, reason in (
            (1, SuppressionReason.BOUNCED),
            (2, SuppressionReason.BOUNCED),
            (3, SuppressionReason.COMPLAINED),
        ):
            suppressions.add(session, user_id, reason, now=utcnow(), source="test")
    collector = ReportsCollector(
        redis.Redis.from_url(settings.broker_url),
        namespace=settings.broker_namespace,
        sessions=sessions,
        queues=(BUILD_REPORT.queue,),
        breaker_name=mail_breaker_name(settings.broker_namespace),
    )

    [family] = [f for f in collector.collect() if f.name == "reports_suppressions"]

    assert {s.labels["reason"]: s.value for s in family.samples} == {"unsubscribed": 0, "bounced": 2, "complained": 1}
