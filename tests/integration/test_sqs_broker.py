"""The SQS broker's own parts, on moto's server: the batched send, delays beyond SQS's 15 minutes
sent on in steps, the visibility a live worker keeps and a killed one gives back, the backlog SQS
counts and what reconcile makes of it, and dead letters moved by a worker or by SQS's redrive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import dramatiq
import pytest
from sqlalchemy import select

from reports.fanout import runs
from reports.fanout.progress import count
from reports.jobs import BUILD_REPORT, ReportJob
from reports.models import DeadLetter, DeadLetterReason
from reports.worker import sqs
from reports.worker.broker import build_broker, message_for, send
from reports.worker.dead_letter_sink import REDRIVEN, DeadLetterSink, absorb_sqs_dead_letters
from reports.worker.queues import queue_for
from tests.integration.conftest import PERIOD, walk_everything
from tests.support.databases import load_users
from tests.support.environment import REPO
from tests.support.processes import free_port, run_cli
from tests.support.sqs import REGION, purge, queue_depths, take_all
from tests.support.waiting import wait_until

ON_SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
ON_POSTGRESQL = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


@pytest.fixture
def sqs_settings(settings, sqs_url):
    return replace(settings, broker_url=sqs_url, redis_url=settings.shared_redis_url)


@pytest.fixture
def broker(sqs_settings):
    broker = build_broker(sqs_settings)
    yield broker
    broker.close()


def _payloads(first: int, last: int) -> list[dict[str, Any]]:
    return [ReportJob(PERIOD, user_id, "v1").payload() for user_id in range(first, last + 1)]


# --- sending ---------------------------------------------------------------------------------


@ON_SQLITE
def test_send_jobs_sends_every_message_once_across_batches_and_chunks(broker, sqs_settings):
    # Two chunks of the queue port (1,000), the second ending in a part-filled batch of ten.
    sent = queue_for(broker).send_jobs(BUILD_REPORT, _payloads(1, 1_005))

    assert sent == 1_005
    assert queue_depths(sqs_settings.broker_url, BUILD_REPORT.queue) == (1_005, 0, 0, 0)
    messages = take_all(sqs_settings.broker_url, BUILD_REPORT.queue)
    assert Counter(ReportJob.parse(m.args, m.kwargs).user_id for m in messages) == Counter(range(1, 1_006))
    assert {m.actor_name for m in messages} == {BUILD_REPORT.name}
    assert len({m.message_id for m in messages}) == 1_005


# --- delays beyond 15 minutes ----------------------------------------------------------------


class _Enqueued(dramatiq.Middleware):
    def __init__(self) -> None:
        self.delays: list[int | None] = []

    def after_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int | None) -> None:
        self.delays.append(delay)


@ON_SQLITE
def test_a_delay_beyond_the_longest_sqs_takes_is_sent_on_in_steps_and_runs_when_due(broker):
    # SQS's longest delay is 15 minutes; a step of one second shows the same path in seconds.
    broker.delay_step_seconds = 1
    enqueued = _Enqueued()
    broker.add_middleware(enqueued)
    message = message_for(BUILD_REPORT, ReportJob(PERIOD, 7, "v1").payload())
    started = time.monotonic()
    broker.enqueue(message, delay=3_500)

    consumer = broker.consume(BUILD_REPORT.queue, prefetch=1, timeout=1000)
    received = wait_until(lambda: next(consumer), timeout=15, interval=0, what="the message to come due")
    waited = time.monotonic() - started
    consumer.ack(received)

    assert received.message_id == message.message_id
    assert 3.5 <= waited < 10, waited
    # Sent on a second at a time for what was left: the n-th step leaves at least n seconds after
    # the first send, so it carries at most 3.5 s less n; how many steps a slow machine takes varies.
    first, *steps = enqueued.delays
    assert first == 3_500 and steps, enqueued.delays
    assert all(step is not None and step <= 3_500 - 1_000 * n for n, step in enumerate(steps, start=1)), steps
    assert sqs.DUE_OPTION not in received.options


@ON_SQLITE
def test_an_hour_long_retry_is_taken_by_sqs_for_15_minutes_at_a_time(broker, sqs_settings):
    # What dramatiq-sqs refuses with MessageDelayTooLong.
    send(broker, BUILD_REPORT, ReportJob(PERIOD, 7, "v1").payload(), delay_ms=3_600_000)

    assert queue_depths(sqs_settings.broker_url, BUILD_REPORT.queue) == (0, 1, 0, 0)


# --- visibility --------------------------------------------------------------------------------

#: A worker process that holds one bulk message and prints its id, then waits to be killed.
HOLDER = """
import sys, time
from reports.settings import Settings
from reports.worker.broker import build_broker
broker = build_broker(Settings.from_env())
consumer = broker.consume("bulk", prefetch=1, timeout=1000)
while (message := next(consumer)) is None:
    pass
print("held", message.message_id, flush=True)
time.sleep(600)
"""


@ON_SQLITE
def test_a_live_workers_message_stays_hidden_past_the_visibility_timeout_and_a_killed_ones_comes_back(
    sqs_settings, broker
):
    settings = replace(
        sqs_settings, smtp_timeout_seconds=0.5, claim_lease_seconds=2.5, sqs_visibility_timeout_seconds=3
    )
    message = message_for(BUILD_REPORT, ReportJob(PERIOD, 7, "v1").payload())
    broker.enqueue(message)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        env={**os.environ, **settings.as_environ()},
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().split() == ["held", message.message_id]
        other = build_broker(settings).consume(BUILD_REPORT.queue, prefetch=1, timeout=1000)

        # Two timeouts: the holder's keeper extends it every second.
        deadline = time.monotonic() + 2 * settings.sqs_visibility_timeout_seconds
        while time.monotonic() < deadline:
            assert next(other) is None, "a live worker's message came back to another"

        os.killpg(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        again = wait_until(lambda: next(other), timeout=10, interval=0, what="the killed worker's message")
        came_back = time.monotonic() - killed
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()

    assert again.message_id == message.message_id
    # Within one timeout of its last extension, and one long poll of the consumer.
    assert came_back <= settings.sqs_visibility_timeout_seconds + 1.5, came_back


# --- the backlog and reconcile -----------------------------------------------------------------


@ON_SQLITE
def test_the_backlog_counts_ready_delayed_and_in_flight_messages(broker):
    queue_for(broker).send_jobs(BUILD_REPORT, _payloads(1, 4))
    send(broker, BUILD_REPORT, ReportJob(PERIOD, 99, "v1").payload(), delay_ms=60_000)
    consumer = broker.consume(BUILD_REPORT.queue, prefetch=1, timeout=1000)
    assert wait_until(lambda: next(consumer), timeout=5, interval=0, what="a message") is not None

    # Three ready, one delayed, one received by a worker and not yet deleted.
    assert sqs.depths(broker.client, broker.url_of(BUILD_REPORT.queue)) == (3, 1, 1)
    assert queue_for(broker).backlog(BUILD_REPORT.queue) == 5
    assert queue_for(broker).backlog("default") == 0


def _reconcile(sessions, queue, settings):
    return runs.reconcile_through(
        sessions,
        queue,
        PERIOD,
        redis_client=queue.broker.shared_redis,
        namespace=settings.broker_namespace,
        stuck_after=timedelta(minutes=10),
        now=datetime.now(UTC) + timedelta(hours=1),
    )


@ON_POSTGRESQL
def test_reconcile_waits_while_sqs_counts_a_message_and_re_sends_what_it_lost(sessions, sqs_settings, broker):
    population = load_users(sessions, count=4)
    port = queue_for(broker)
    walk_everything(sessions, sqs_settings, queue=port)
    # A retry an hour away: delayed in SQS, counted, so on its way.
    send(broker, BUILD_REPORT, ReportJob(PERIOD, population.active[0], "v1").payload(), delay_ms=3_600_000)

    waiting = _reconcile(sessions, port, sqs_settings)
    assert (waiting.requeued, waiting.waiting) == (0, len(population.active))

    purge(sqs_settings.broker_url, BUILD_REPORT.queue)
    lost = _reconcile(sessions, port, sqs_settings)
    assert (lost.requeued, lost.waiting) == (len(population.active), 0)
    assert queue_depths(sqs_settings.broker_url, BUILD_REPORT.queue)[0] == len(population.active)


class _StaleCount:
    """The queue port with SQS's count read as zero: what a count lagging behind a send shows."""

    def __init__(self, port) -> None:
        self.port = port
        self.broker = port.broker

    def backlog(self, queue: str) -> int:
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.port, name)


@ON_POSTGRESQL
def test_a_count_that_lags_behind_costs_reconcile_a_message_per_item_and_no_second_email(
    sessions, sqs_settings, broker, smtp_server, start_workers
):
    settings = replace(sqs_settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=3)
    port = queue_for(broker)
    walk_everything(sessions, settings, queue=port)

    stale = _reconcile(sessions, _StaleCount(port), settings)
    assert stale.requeued == len(population.active)
    assert queue_depths(settings.broker_url, BUILD_REPORT.queue)[0] == 2 * len(population.active)

    start_workers(settings, processes=1, threads=2, queues=(BUILD_REPORT.queue,))
    wait_until(lambda: queue_for(broker).backlog(BUILD_REPORT.queue) == 0, timeout=60, what="both copies to run")
    with sessions() as session:
        assert count(session, PERIOD).delivered == len(population.active)
    assert sorted(smtp_server.by_user()) == population.active
    assert {user: len(messages) for user, messages in smtp_server.by_user().items()} == dict.fromkeys(
        population.active, 1
    )


# --- dead letters ----------------------------------------------------------------------------


def _dead_letters(sessions) -> list[DeadLetter]:
    with sessions() as session:
        return list(session.scalars(select(DeadLetter)))


@ON_SQLITE
def test_a_message_received_past_its_receive_count_lands_in_the_dead_letter_table(sessions, sqs_settings):
    broker = build_broker(replace(sqs_settings, sqs_max_receive_count=2))
    population = load_users(sessions, count=2)
    walk_everything(sessions, sqs_settings)
    user = population.active[0]
    message = message_for(BUILD_REPORT, ReportJob(PERIOD, user, "v1").payload())
    broker.enqueue(message)
    url = broker.url_of(BUILD_REPORT.queue)
    # Received twice and never deleted: two workers that died running it.
    for _ in range(2):
        assert broker.client.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    # The next receive finds it past its count: SQS moves it to the dead-letter queue.
    assert broker.client.receive_message(QueueUrl=url, VisibilityTimeout=0).get("Messages", []) == []
    assert queue_depths(sqs_settings.broker_url, BUILD_REPORT.queue) == (0, 0, 0, 1)

    assert absorb_sqs_dead_letters(broker, DeadLetterSink(sessions, alerts=None)) == 1

    [letter] = _dead_letters(sessions)
    assert (letter.message_id, letter.reason, letter.user_id) == (message.message_id, DeadLetterReason.BROKER, user)
    assert letter.error_message == REDRIVEN
    with sessions() as session:
        assert count(session, PERIOD).dead == 1
    assert queue_depths(sqs_settings.broker_url, BUILD_REPORT.queue) == (0, 0, 0, 0)
    broker.close()


@ON_SQLITE
def test_a_rejected_message_the_store_cannot_take_waits_in_the_dead_letter_queue_until_it_can(
    sessions, sqs_settings, broker
):
    message = message_for(BUILD_REPORT, ReportJob(PERIOD, 7, "v1").payload())
    broker.client.send_message(
        QueueUrl=broker.dead_letter_url_of(BUILD_REPORT.queue),
        MessageBody=sqs.encode(message),
        MessageAttributes={sqs.REJECTED_ATTRIBUTE: {"DataType": "String", "StringValue": "true"}},
    )

    def unavailable(_dead):
        raise OSError("database down")

    with pytest.raises(OSError):
        absorb_sqs_dead_letters(broker, unavailable)
    # Visible again at once, not after a visibility timeout.
    assert queue_depths(sqs_settings.broker_url, BUILD_REPORT.queue)[3] == 1
    assert absorb_sqs_dead_letters(broker, DeadLetterSink(sessions, alerts=None)) == 1

    [letter] = _dead_letters(sessions)
    assert (letter.message_id, letter.reason) == (message.message_id, DeadLetterReason.BROKER)
    assert letter.error_message != REDRIVEN
    assert queue_depths(sqs_settings.broker_url, BUILD_REPORT.queue)[3] == 0


# --- SQS out of reach --------------------------------------------------------------------------


@ON_SQLITE
def test_a_command_says_in_one_line_that_sqs_cannot_be_reached(sqs_settings, sessions):
    nothing_there = f"http://127.0.0.1:{free_port()}"
    settings = replace(sqs_settings, broker_url=f"sqs://{REGION}/test?endpoint_url={nothing_there}")
    load_users(sessions, count=1)

    result = run_cli(settings, "send-now", "1", str(PERIOD), "--allow-untriggered")

    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    # The request is recorded before its message: the line says so, and that reconcile sends it.
    assert (
        line.startswith("error: Send-now request ") and "the broker did not take its message (SqsUnreachable)" in line
    )
