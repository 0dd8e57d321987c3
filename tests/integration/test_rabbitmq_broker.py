"""The RabbitMQ broker's own parts, on a real RabbitMQ vhost: the bulk enqueue with batched
publisher confirms, the backlog, and the broker's dead letters moved into the store."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from urllib.parse import unquote, urlsplit

import dramatiq
import pika
import pytest
from sqlalchemy import select

from reports.jobs import BUILD_REPORT, ReportJob
from reports.models import DeadLetter, DeadLetterReason
from reports.periods import Period
from reports.worker import rabbitmq
from reports.worker.broker import backlog, build_broker, send, send_many
from reports.worker.dead_letter_sink import DeadLetterSink, absorb_rabbitmq_dead_letters
from tests.support.rabbitmq import queue_depths
from tests.support.waiting import wait_until

PERIOD = Period.parse("2026-10")


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
    sent = send_many(broker, BUILD_REPORT, _payloads(2_500))

    assert sent == 2_500
    assert queue_depths(rabbit_settings.broker_url, BUILD_REPORT.queue) == (2_500, 0, 0)
    messages = _received(rabbit_settings.broker_url, BUILD_REPORT.queue)
    assert [ReportJob.parse(m["args"], m["kwargs"]).user_id for m in messages] == list(range(1, 2_501))
    assert {m["actor_name"] for m in messages} == {BUILD_REPORT.name}
    assert len({m["message_id"] for m in messages}) == 2_500


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_send_many_reopens_a_connection_rabbitmq_dropped(broker, rabbit_settings):
    send_many(broker, BUILD_REPORT, _payloads(3))
    # What RabbitMQ does to an idle thread's connection that missed its heartbeats.
    vhost = unquote(urlsplit(rabbit_settings.broker_url).path.lstrip("/"))
    subprocess.run(["rabbitmqctl", "close_all_connections", "-p", vhost, "test"], check=True, capture_output=True)
    wait_until(lambda: not broker.connection.is_open or _closed_seen(broker), timeout=10, what="the close")

    assert send_many(broker, BUILD_REPORT, _payloads(3)) == 3
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
    send_many(broker, BUILD_REPORT, _payloads(4))
    send(broker, BUILD_REPORT, ReportJob(PERIOD, 99, "v1").payload(), delay_ms=60_000)

    assert backlog(broker, BUILD_REPORT.queue) == 5
    assert backlog(broker, "default") == 0


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
