"""`reports exporter` serves what Prometheus scrapes: queues, dead letters, the breaker, periods."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from reports import counters
from reports.clock import utcnow
from reports.delivery.breaker import CircuitBreaker, mail_breaker_name
from reports.fanout import coordinator, runs
from reports.fanout.progress import count
from reports.periods import Period
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for
from tests.support.databases import load_users
from tests.support.environment import REPO
from tests.support.processes import free_port, run_cli
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@contextmanager
def running_exporter(
    settings, *args: str, **environ: str
) -> Iterator[tuple[subprocess.Popen[str], Callable[[], Samples]]]:
    """``reports exporter`` on a free port (``--port``, plus ``args``), with ``environ`` over the settings."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "reports", "exporter", "--port", str(port), *args],
        env={**os.environ, **settings.as_environ(), **environ},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def scrape() -> Samples:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def up() -> bool:
        try:
            return bool(scrape())
        except OSError:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            return False

    try:
        wait_until(up, timeout=20, what="the exporter to serve")
        yield process, scrape
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def exporter(settings):
    # Figures as they are at each scrape: these tests change them between scrapes.
    with running_exporter(settings, "--host", "127.0.0.1", EXPORTER_CACHE_SECONDS="0") as running:
        yield running


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_the_exporter_serves_queue_depths_dead_letters_breaker_state_and_period_counts(
    settings, sessions, smtp_server, start_workers, exporter
):
    process, scrape = exporter
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=12, inactive_every=1000)
    smtp_server.handler.fault = lambda rcpt, attempt: "550 5.1.1 No such user" if rcpt == "user3@example.test" else None
    period = Period.parse(PERIOD)
    with sessions.begin() as session:
        runs.trigger(session, period, template_version="v1", now=utcnow())
    broker = build_broker(settings)
    coordinator.walk_slice(sessions, period, queue_for(broker), page_size=50, budget_seconds=60)

    # Before any worker: every message waits in the bulk queue, the oldest for a while now.
    time.sleep(1.1)
    before = scrape()
    assert value(before, "reports_queue_messages", queue="bulk", state="ready") == len(population.active)
    assert value(before, "reports_queue_oldest_message_age_seconds", queue="bulk") >= 1.0
    assert value(before, "reports_period_items", period=PERIOD, state="pending") == len(population.active)
    assert value(before, "reports_period_planned", period=PERIOD) == 1.0
    assert value(before, "reports_breaker_state", breaker="mail") == 0.0

    start_workers(settings, processes=1, threads=4)

    def complete() -> bool:
        with sessions.begin() as session:
            return count(session, period).complete

    wait_until(complete, timeout=60, what="the period")

    def outcomes(samples: Samples) -> float:
        return sum(
            count
            for (name, labels), count in samples.items()
            if name == "reports_actor_outcomes_total" and ("actor", "build_report") in labels
        )

    def all_timed() -> Samples | None:
        samples = scrape()
        succeeded = samples.get(("reports_actor_outcomes_total", (("actor", "build_report"), ("outcome", "success"))))
        timed = samples.get(("reports_actor_duration_seconds_count", (("actor", "build_report"),)))
        # On a loaded machine a message may be deferred once (too little of its lease left) and run
        # again: every run is timed and counted with its outcome, so wait for the last one's.
        return samples if succeeded == len(population.active) - 1 and timed == outcomes(samples) else None

    # The workers write their actor metrics once a second, so the last messages' come a moment later.
    after = wait_until(all_timed, timeout=10, what="the workers' actor metrics to be flushed")
    assert value(after, "reports_queue_messages", queue="bulk", state="ready") == 0
    assert value(after, "reports_queue_oldest_message_age_seconds", queue="bulk") == 0
    assert value(after, "reports_period_items", period=PERIOD, state="delivered") == len(population.active) - 1
    assert value(after, "reports_period_items", period=PERIOD, state="dead") == 1
    assert value(after, "reports_dead_letters_total", queue="bulk", actor="build_report", reason="permanent") == 1
    assert value(after, "reports_dead_letters_stored", replayed="false") == 1
    assert value(after, "reports_period_total", period=PERIOD) == len(population.active)
    assert value(after, "reports_period_triggered_timestamp_seconds", period=PERIOD) > time.time() - 600
    # Every run of a message counted once with its outcome, and timed.
    assert value(after, "reports_actor_outcomes_total", actor="build_report", outcome="success") == (
        len(population.active) - 1
    )
    assert value(after, "reports_actor_outcomes_total", actor="build_report", outcome="dead") == 1
    runs_counted = outcomes(after)
    assert runs_counted >= len(population.active)
    assert value(after, "reports_actor_duration_seconds_count", actor="build_report") == runs_counted
    assert value(after, "reports_actor_duration_seconds_bucket", actor="build_report", le="+Inf") == runs_counted
    assert 0 < value(after, "reports_actor_duration_seconds_sum", actor="build_report") < 60

    # The breaker as a worker process builds it: its transitions are counted fleet-wide.
    client = redis.Redis.from_url(settings.broker_url)
    breaker = CircuitBreaker(
        client,
        name=mail_breaker_name(settings.broker_namespace),
        failure_threshold=1,
        window_ms=10_000,
        cooldown_ms=60_000,
        probe_timeout_ms=1_000,
        on_change=lambda _b, a: counters.count(
            client, settings.broker_namespace, "breaker_transitions", "mail", str(a)
        ),
    )
    breaker.record_failure(int(time.time() * 1000), token="t")
    opened = scrape()
    assert value(opened, "reports_breaker_state", breaker="mail") == 2.0
    assert value(opened, "reports_breaker_transitions_total", breaker="mail", state="open") == 1

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0


@pytest.mark.parametrize("broker_kind", ["rabbitmq", "sqs"], indirect=True)
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_rabbitmq_and_sqs_the_exporter_shows_the_messages_workers_hold_and_the_oldest_waiting_ones_age(
    settings, sessions, smtp_server, start_workers, exporter
):
    _process, scrape = exporter
    # Each email takes 4 s, so the worker's two threads are busy and two more messages wait prefetched.
    settings = replace(
        settings,
        smtp_url=smtp_server.url,
        smtp_timeout_seconds=30,
        claim_lease_seconds=40,
        sqs_visibility_timeout_seconds=40,
    )
    smtp_server.handler.delay_seconds = 4.0
    population = load_users(sessions, count=6, inactive_every=1000)
    period = Period.parse(PERIOD)
    with sessions.begin() as session:
        runs.trigger(session, period, template_version="v1", now=utcnow())
    walked_at = time.time()
    broker = build_broker(settings)
    coordinator.walk_slice(sessions, period, queue_for(broker), page_size=50, budget_seconds=60)
    broker.close()

    # No worker yet: neither broker shows a message's age, so the age is how long the exporter
    # has seen the queue waiting unheld, a lower bound.
    first = scrape()
    assert value(first, "reports_queue_messages", queue="bulk", state="ready") == len(population.active)
    assert value(first, "reports_queue_messages", queue="bulk", state="in_progress") == 0
    time.sleep(1.1)
    unheld = scrape()
    assert 1.0 <= value(unheld, "reports_queue_oldest_message_age_seconds", queue="bulk") <= time.time() - walked_at

    start_workers(settings, processes=1, threads=2, queues=("bulk",))

    def held_by_the_worker() -> Samples | None:
        samples = scrape()
        return samples if value(samples, "reports_queue_messages", queue="bulk", state="in_progress") == 4 else None

    busy = wait_until(held_by_the_worker, timeout=10, what="the worker's four messages in progress")
    assert value(busy, "reports_queue_messages", queue="bulk", state="ready") == len(population.active) - 4
    # The oldest prefetched message's own age: it was enqueued by the walk.
    age = value(busy, "reports_queue_oldest_message_age_seconds", queue="bulk")
    assert time.time() - walked_at - 3 <= age <= time.time() - walked_at + 1

    def drained() -> Samples | None:
        samples = scrape()
        held = value(samples, "reports_queue_messages", queue="bulk", state="in_progress")
        return samples if held == 0 and len(smtp_server.messages) == len(population.active) else None

    after = wait_until(drained, timeout=60, what="every email and the worker's snapshot to empty")
    assert value(after, "reports_queue_messages", queue="bulk", state="ready") == 0
    assert value(after, "reports_queue_oldest_message_age_seconds", queue="bulk") == 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_with_the_shared_redis_down_the_exporter_serves_the_rest_and_logs_no_password(settings, sessions):
    load_users(sessions, count=3, inactive_every=1000)
    with sessions.begin() as session:
        runs.trigger(session, Period.parse(PERIOD), template_version="v1", now=utcnow())
    shared = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    with running_exporter(settings, "--host", "127.0.0.1", REDIS_URL=shared) as (process, scrape):
        samples = scrape()
        assert value(samples, "reports_exporter_source_up", source="redis") == 0
        assert value(samples, "reports_exporter_source_up", source="broker") == 1
        assert value(samples, "reports_exporter_source_up", source="database") == 1
        assert value(samples, "reports_queue_messages", queue="bulk", state="ready") == 0
        assert value(samples, "reports_period_planned", period=PERIOD) == 0
        assert not any(name == "reports_breaker_state" for name, _labels in samples)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        logged = process.stderr.read()
    assert "could not read the redis (ConnectionError)" in logged
    assert "hunter2" not in logged


def test_the_exporter_rejects_a_bad_port_in_one_line(settings):
    result = run_cli(settings, "exporter", "--port", "70000")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_exporter_listens_on_exporter_host_and_serves_one_collection_per_window(settings, sessions):
    with running_exporter(settings, EXPORTER_HOST="127.0.0.1", EXPORTER_CACHE_SECONDS="30") as (process, scrape):
        dead = ("reports_dead_letters_total", (("actor", "build_report"), ("queue", "bulk"), ("reason", "permanent")))
        assert scrape()[dead] == 0
        client = redis.Redis.from_url(settings.broker_url)
        counters.count(client, settings.broker_namespace, "dead_letters", "bulk", "build_report", "permanent")
        client.close()

        assert scrape()[dead] == 0  # within the window: the figures collected at the first scrape
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert "Serving metrics on http://127.0.0.1:" in process.stderr.read()
