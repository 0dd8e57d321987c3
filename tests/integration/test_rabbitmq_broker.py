"""The RabbitMQ broker's own parts, on a real RabbitMQ vhost: the bulk enqueue with batched
publisher confirms, the backlog (with what real worker processes hold), and dead letters: the
broker's moved into the store, and an undecodable message stored at once by the worker."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from urllib.parse import unquote, urlsplit

import dramatiq
import pika
import pytest
from sqlalchemy import select

from reports.clock import utcnow
from reports.fanout import coordinator, runs
from reports.jobs import BUILD_REPORT, ReportJob
from reports.models import DeadLetter, DeadLetterReason
from reports.periods import Period
from reports.worker import held, rabbitmq
from reports.worker.broker import build_broker, send
from reports.worker.dead_letter_sink import BrokerDeadLetters, DeadLetterSink, absorb_rabbitmq_dead_letters
from reports.worker.queues import queue_for
from tests.support.databases import load_users
from tests.support.rabbitmq import queue_depths
from tests.support.waiting import wait_until

PERIOD = Period.parse("2026-10")

#: The worker tests run on PostgreSQL, as a deployment's workers do.
ON_POSTGRESQL = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

#: Seconds after a write within which a change of what a worker holds shows, at most: the
#: publish interval plus the consumer's idle turn (Dramatiq's worker timeout, 1 s) and slack.
SHOWN_WITHIN = held.PUBLISH_INTERVAL_SECONDS + 2


@pytest.fixture
def rabbit_settings(settings, rabbitmq_url):
    return replace(settings, broker_url=rabbitmq_url, redis_url=settings.shared_redis_url)


@pytest.fixture
def broker(rabbit_settings):
    broker = build_broker(rabbit_settings)
    yield broker
    broker.close()


def _payloads(count: int) -> list[dict]:
    return [ReportJob(PERIOD, user_id, "v1").payload() for user_id in range(1, count + 1)]


def _received(url: str, queue: str) -> list[dict]:
    """Take every message ready in ``queue`` and return them decoded, in queue order."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        bodies = []
        while True:
            method, _properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(json.loads(body))
    finally:
        connection.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_send_many_publishes_every_message_once_in_order_across_chunks(broker, rabbit_settings):
    sent = queue_for(broker).send_jobs(BUILD_REPORT, _payloads(2_500))

    assert sent == 2_500
    assert queue_depths(rabbit_settings.broker_url, BUILD_REPORT.queue) == (2_500, 0, 0)
    messages = _received(rabbit_settings.broker_url, BUILD_REPORT.queue)
    assert [ReportJob.parse(m["args"], m["kwargs"]).user_id for m in messages] == list(range(1, 2_501))
    assert {m["actor_name"] for m in messages} == {BUILD_REPORT.name}
    assert len({m["message_id"] for m in messages}) == 2_500


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_send_many_reopens_a_connection_rabbitmq_dropped(broker, rabbit_settings):
    queue_for(broker).send_jobs(BUILD_REPORT, _payloads(3))
    # What RabbitMQ does to an idle thread's connection that missed its heartbeats.
    vhost = unquote(urlsplit(rabbit_settings.broker_url).path.lstrip("/"))
    subprocess.run(["rabbitmqctl", "close_all_connections", "-p", vhost, "test"], check=True, capture_output=True)
    wait_until(lambda: not broker.connection.is_open or _closed_seen(broker), timeout=10, what="the close")

    assert queue_for(broker).send_jobs(BUILD_REPORT, _payloads(3)) == 3
    assert queue_depths(rabbit_settings.broker_url, BUILD_REPORT.queue)[0] == 6


def _closed_seen(broker) -> bool:
    """Let pika read what the server sent; True once it saw the connection closed."""
    try:
        broker.connection.process_data_events(time_limit=0.1)
    except pika.exceptions.AMQPError:
        return True
    return not broker.connection.is_open


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_batch_rabbitmq_refuses_raises_a_broker_connection_error(broker, rabbit_settings):
    # A queue whose length limit rejects what exceeds it: RabbitMQ nacks those publishes.
    channel = broker.channel
    channel.queue_declare("capped", durable=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    broker.queues.add("capped")

    with pytest.raises(dramatiq.errors.BrokerConnectionError, match="refused 3 of 5"):
        rabbitmq.publish_confirmed(broker, "capped", [dramatiq.Message("capped", "a", (), {}, {}) for _ in range(5)])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_backlog_counts_ready_and_delayed_messages(broker):
    queue_for(broker).send_jobs(BUILD_REPORT, _payloads(4))
    send(broker, BUILD_REPORT, ReportJob(PERIOD, 99, "v1").payload(), delay_ms=60_000)

    assert queue_for(broker).backlog(BUILD_REPORT.queue) == 5
    assert queue_for(broker).backlog("default") == 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_brokers_dead_letters_move_into_the_store_and_leave_rabbitmq(broker, rabbit_settings, sessions):
    channel = broker.channel
    broker.declare_queue(BUILD_REPORT.queue, ensure=True)
    dead = dramatiq.Message(BUILD_REPORT.queue, BUILD_REPORT.name, (str(PERIOD), 7, "v1"), {}, {})
    channel.basic_publish("", f"{BUILD_REPORT.queue}.XQ", dead.encode())
    channel.basic_publish("", f"{BUILD_REPORT.queue}.XQ", b"\xff not a message")

    moved = absorb_rabbitmq_dead_letters(broker, DeadLetterSink(sessions, alerts=None))

    assert moved == 2
    assert queue_depths(rabbit_settings.broker_url, BUILD_REPORT.queue)[2] == 0
    with sessions() as session:
        stored = {row.reason: row for row in session.scalars(select(DeadLetter))}
    assert set(stored) == {DeadLetterReason.BROKER, DeadLetterReason.UNDECODABLE}
    assert stored[DeadLetterReason.BROKER].message_id == dead.message_id
    assert stored[DeadLetterReason.BROKER].queue == BUILD_REPORT.queue
    assert stored[DeadLetterReason.UNDECODABLE].queue == BUILD_REPORT.queue


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_dead_letter_the_store_cannot_take_stays_in_rabbitmq(broker, rabbit_settings):
    broker.declare_queue(BUILD_REPORT.queue, ensure=True)
    message = dramatiq.Message(BUILD_REPORT.queue, BUILD_REPORT.name, (str(PERIOD), 7, "v1"), {}, {})
    broker.channel.basic_publish("", f"{BUILD_REPORT.queue}.XQ", message.encode())

    def unavailable(_dead):
        raise OSError("database down")

    with pytest.raises(OSError):
        absorb_rabbitmq_dead_letters(broker, unavailable)
    assert queue_depths(rabbit_settings.broker_url, BUILD_REPORT.queue)[2] == 1


# --- what worker processes hold ---------------------------------------------------------------


@pytest.fixture
def slow_mail(rabbit_settings, smtp_server):
    """Settings whose SMTP server takes ``smtp_server.handler.delay_seconds`` per recipient, well
    within the client's timeout: messages stay in progress (and prefetched behind them) meanwhile."""
    return replace(rabbit_settings, smtp_url=smtp_server.url, smtp_timeout_seconds=30, claim_lease_seconds=40)


def _walk(sessions, broker) -> None:
    with sessions.begin() as session:
        runs.trigger(session, PERIOD, template_version="v1", now=utcnow())
    coordinator.walk_slice(sessions, PERIOD, queue_for(broker), page_size=50, budget_seconds=60)


def _walked_behind_slow_mail(sessions, broker, smtp_server, *, delay_seconds: float) -> int:
    """Six users' reports in the bulk queue, mailed ``delay_seconds`` apart per thread; how many."""
    population = load_users(sessions, count=6, inactive_every=1000)
    smtp_server.handler.delay_seconds = delay_seconds
    _walk(sessions, broker)
    return len(population.active)


def _held(broker) -> dict[str, held.QueueHeld]:
    return held.read(broker.shared_redis, broker.namespace)


@ON_POSTGRESQL
def test_messages_a_worker_holds_count_in_the_backlog_until_they_are_acked(
    broker, slow_mail, sessions, smtp_server, start_workers
):
    users = _walked_behind_slow_mail(sessions, broker, smtp_server, delay_seconds=4.0)
    send(broker, BUILD_REPORT, ReportJob(PERIOD, 99, "v1").payload(), delay_ms=600_000)
    assert queue_for(broker).backlog(BUILD_REPORT.queue) == users + 1

    # One process, two threads: two messages in progress, two prefetched (Dramatiq prefetches two
    # per thread), the delayed one held until due; RabbitMQ shows only the two still ready.
    start_workers(slow_mail, processes=1, threads=2, queues=(BUILD_REPORT.queue,))
    wait_until(
        lambda: queue_depths(slow_mail.broker_url, BUILD_REPORT.queue) == (2, 0, 0),
        timeout=10,
        what="the worker to take its prefetch",
    )
    figures = wait_until(
        lambda: (f := _held(broker)).get("bulk", held.QueueHeld()).count == 4 and f,
        timeout=SHOWN_WITHIN,
        what="the worker's snapshot",
    )
    assert figures["bulk.DQ"] == held.QueueHeld(1, None)
    # The two prefetched ones wait; their timestamps are from the walk a moment ago.
    assert figures["bulk"].oldest_waiting_ms is not None
    assert 0 <= time.time() * 1000 - figures["bulk"].oldest_waiting_ms < 60_000
    assert queue_for(broker).backlog(BUILD_REPORT.queue) == users + 1

    wait_until(lambda: len(smtp_server.messages) == users, timeout=60, what="every email")
    # Acked: only the delayed message is left, held by the worker.
    wait_until(
        lambda: queue_for(broker).backlog(BUILD_REPORT.queue) == 1, timeout=SHOWN_WITHIN, what="the acks to show"
    )
    assert _held(broker) == {"bulk.DQ": held.QueueHeld(1, None)}


@ON_POSTGRESQL
def test_a_killed_workers_held_messages_stop_counting_within_the_snapshot_ttl(
    broker, slow_mail, sessions, smtp_server, start_workers
):
    users = _walked_behind_slow_mail(sessions, broker, smtp_server, delay_seconds=20.0)
    group = start_workers(slow_mail, processes=1, threads=2, queues=(BUILD_REPORT.queue,))
    wait_until(lambda: _held(broker).get("bulk", held.QueueHeld()).count == 4, timeout=10, what="the snapshot")

    group.kill()
    killed_at = time.monotonic()
    smtp_server.handler.delay_seconds = 0.0
    # RabbitMQ takes the messages back at once; the dead process's snapshot lives out its TTL.
    wait_until(
        lambda: queue_depths(slow_mail.broker_url, BUILD_REPORT.queue)[0] == users,
        timeout=5,
        what="RabbitMQ to requeue the killed worker's messages",
    )
    wait_until(lambda: _held(broker) == {}, timeout=held.SNAPSHOT_TTL_SECONDS + 2, what="the snapshot to expire")
    assert time.monotonic() - killed_at <= held.SNAPSHOT_TTL_SECONDS + 2
    assert queue_for(broker).backlog(BUILD_REPORT.queue) == users
    assert smtp_server.messages == []


@ON_POSTGRESQL
def test_an_undecodable_message_is_a_dead_letter_at_once_and_the_next_message_runs(
    broker, rabbit_settings, sessions, smtp_server, start_workers
):
    settings = replace(rabbit_settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=3, inactive_every=1000)
    # Started first, so its boot sweep of .XQ is over before the bad messages arrive.
    group = start_workers(settings, processes=1, threads=2, queues=(BUILD_REPORT.queue,))
    channel = broker.channel
    broker.declare_queue(BUILD_REPORT.queue, ensure=True)
    channel.basic_publish(
        "", BUILD_REPORT.queue, b"not json", pika.BasicProperties(message_id="raw-not-json", delivery_mode=2)
    )
    channel.basic_publish("", BUILD_REPORT.queue, b"\xff\xfe{")
    _walk(sessions, broker)

    wait_until(lambda: len(smtp_server.messages) == len(population.active), timeout=30, what="every email")
    letters = wait_until(
        lambda: (rows := _dead_letters(sessions)) and len(rows) == 2 and rows, timeout=5, what="two dead letters"
    )
    assert {row.reason for row in letters} == {DeadLetterReason.UNDECODABLE}
    assert {row.queue for row in letters} == {BUILD_REPORT.queue}
    by_id = {row.message_id: row for row in letters}
    assert "not json" in by_id.pop("raw-not-json").error_message
    [(unnamed_id, unnamed)] = by_id.items()
    assert unnamed_id.startswith("rabbitmq-") and "\ufffd" in unnamed.error_message
    # Stored, then acked: nothing left in .XQ for a later sweep to store a second time.
    assert queue_depths(settings.broker_url, BUILD_REPORT.queue) == (0, 0, 0)
    log = group.log()
    assert "Restarting consumer" not in log and "unexpected error" not in log, log[-5000:]


def _dead_letters(sessions) -> list[DeadLetter]:
    with sessions() as session:
        return list(session.scalars(select(DeadLetter)))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_undecodable_message_the_store_cannot_take_waits_in_the_dead_letter_queue(broker, rabbit_settings):
    def unavailable(_dead):
        raise OSError("database down")

    broker.add_middleware(BrokerDeadLetters(unavailable, interval_seconds=3600))
    broker.declare_queue(BUILD_REPORT.queue, ensure=True)
    broker.channel.basic_publish("", BUILD_REPORT.queue, b"not json")
    consumer = broker.consume(BUILD_REPORT.queue, prefetch=1, timeout=100)
    try:
        # Nacked into .XQ, where the next sweep (a rejection, a worker boot) stores it.
        wait_until(
            lambda: (
                next(consumer) is None and queue_depths(rabbit_settings.broker_url, BUILD_REPORT.queue) == (0, 0, 1)
            ),
            timeout=5,
            what="the message in .XQ",
        )
    finally:
        consumer.close()


def _next_message(consumer) -> dramatiq.broker.MessageProxy:
    found: list[dramatiq.broker.MessageProxy] = []
    wait_until(lambda: found.append(next(consumer)) or found[-1] is not None, timeout=10, what="a message")
    return found[-1]


def test_a_message_received_before_a_reconnect_acks_nothing_on_the_new_channel(broker, rabbit_settings):
    for payload in _payloads(2):
        send(broker, BUILD_REPORT, payload)
    old = broker.consume(BUILD_REPORT.queue, prefetch=1, timeout=100)
    before = _next_message(old)
    old.close()  # the connection drops: RabbitMQ requeues the message
    new = broker.consume(BUILD_REPORT.queue, prefetch=1, timeout=100)
    try:
        after = _next_message(new)
        assert after._tag == before._tag, "the new channel numbers its deliveries from 1 again"
        # The message received before the reconnect finishes now: the worker acks it through its
        # current consumer. Acked by its tag, it would take the message that has not run yet.
        new.ack(before)
        next(new)  # the consumer's connection runs what was scheduled on it
    finally:
        new.close()
    wait_until(
        lambda: queue_depths(rabbit_settings.broker_url, BUILD_REPORT.queue)[0] == 2,
        timeout=10,
        what="both messages ready again, neither acked",
    )
