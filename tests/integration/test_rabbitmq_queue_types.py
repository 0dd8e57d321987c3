"""RABBITMQ_QUEUE_TYPE on a real RabbitMQ vhost: every queue the system declares has the type, a
queue RabbitMQ already has as the other type is refused before anything is declared, and a quorum
queue's delivery limit ends in the dead-letter store, not in a lost message."""

from __future__ import annotations

from dataclasses import replace

import pika
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from sqlalchemy import select

from reports.jobs import BUILD_REPORT, QUEUES, ReportJob
from reports.models import DeadLetter, DeadLetterReason
from reports.periods import Period
from reports.worker import rabbitmq
from reports.worker.broker import build_broker, declare_queues, send
from reports.worker.dead_letter_sink import DeadLetterSink, absorb_rabbitmq_dead_letters
from reports.worker.queue_types import QueueMismatch
from reports.worker.queues import queue_for
from tests.support.rabbitmq import queue_depths, queue_types, set_policy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

PERIOD = Period.parse("2026-10")


@pytest.fixture
def typed(settings, rabbitmq_url):
    """The test's settings on its RabbitMQ vhost, and the brokers built from them, closed after."""
    brokers = []

    def build(queue_type: str):
        broker = build_broker(
            replace(
                settings, broker_url=rabbitmq_url, redis_url=settings.shared_redis_url, rabbitmq_queue_type=queue_type
            )
        )
        brokers.append(broker)
        return broker

    yield build
    for broker in brokers:
        broker.close()


def _declare_raw(url: str, name: str, arguments: dict) -> None:
    """Declare a queue as someone else did before (an older release, an operator, a policy)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_declare(name, durable=True, arguments=arguments)
    finally:
        connection.close()


def _classic(queue: str) -> dict:
    """The arguments Dramatiq declares a work queue with, and no type: a classic queue."""
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{queue}.XQ"}


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_every_queue_the_system_declares_has_the_configured_type(typed, rabbitmq_url, queue_type):
    broker = typed(queue_type)
    # What a process declares: at start, to send, to send in bulk, to delay, to count (the exporter).
    declare_queues(broker, QUEUES)
    queue_for(broker).send_jobs(BUILD_REPORT, [ReportJob(PERIOD, 1, "v1").payload()])
    send(broker, BUILD_REPORT, ReportJob(PERIOD, 2, "v1").payload(), delay_ms=60_000)
    assert rabbitmq.ready_counts_at(rabbitmq_url, [BUILD_REPORT.queue], queue_type=queue_type) == {"bulk": (1, 1, 0)}

    assert queue_types(rabbitmq_url) == {f"{q}{suffix}": queue_type for q in QUEUES for suffix in ("", ".DQ", ".XQ")}


def test_the_queues_a_release_before_the_setting_declared_are_taken_for_classic_ones(typed, rabbitmq_url):
    # Declared as Dramatiq declares them, with no type.
    plain = RabbitmqBroker(url=rabbitmq_url, middleware=[])
    plain.declare_queue(BUILD_REPORT.queue, ensure=True)
    plain.close()

    send(typed("classic"), BUILD_REPORT, ReportJob(PERIOD, 1, "v1").payload())

    assert queue_depths(rabbitmq_url, BUILD_REPORT.queue) == (1, 0, 0)
    assert queue_types(rabbitmq_url) == {"bulk": "classic", "bulk.DQ": "classic", "bulk.XQ": "classic"}


@pytest.mark.parametrize(("existing", "configured"), [("classic", "quorum"), ("quorum", "classic")])
def test_a_queue_of_the_other_type_is_refused_in_one_line_before_anything_is_declared(
    typed, rabbitmq_url, existing, configured
):
    # Only the delay queue is there: declaring the three in turn would create the work queue first.
    _declare_raw(rabbitmq_url, "bulk.DQ", {**_classic("bulk"), "x-queue-type": existing})

    with pytest.raises(QueueMismatch) as refused:
        send(typed(configured), BUILD_REPORT, ReportJob(PERIOD, 1, "v1").payload())

    message = str(refused.value)
    assert message.startswith(f"RABBITMQ_QUEUE_TYPE is {configured}, but RabbitMQ already has the queue 'bulk.DQ'")
    assert f"as a {existing} queue" in message and f"set RABBITMQ_QUEUE_TYPE={existing}" in message
    assert "\n" not in message
    assert queue_types(rabbitmq_url) == {"bulk.DQ": existing}


def test_every_queue_is_checked_before_any_is_declared_and_counting_is_refused_too(typed, rabbitmq_url):
    _declare_raw(rabbitmq_url, "default", _classic("default"))
    broker = typed("quorum")

    with pytest.raises(QueueMismatch, match="the queue 'default'"):
        declare_queues(broker, QUEUES)
    # critical comes first and passed the check; it was not declared all the same.
    assert queue_types(rabbitmq_url) == {"default": "classic"}
    with pytest.raises(QueueMismatch, match="the queue 'default'"):
        rabbitmq.ready_counts_at(rabbitmq_url, ["default"], queue_type="quorum")
    assert queue_types(rabbitmq_url) == {"default": "classic"}


def test_a_queue_declared_with_other_arguments_is_refused_with_rabbitmqs_reason(typed, rabbitmq_url):
    _declare_raw(rabbitmq_url, "bulk", {})

    with pytest.raises(QueueMismatch) as refused:
        send(typed("classic"), BUILD_REPORT, ReportJob(PERIOD, 1, "v1").payload())

    assert "already has the queue 'bulk'" in str(refused.value)
    assert "with other arguments (inequivalent arg 'x-dead-letter-exchange'" in str(refused.value)
    assert queue_types(rabbitmq_url) == {"bulk": "classic"}


def test_a_message_returned_past_a_quorum_queues_delivery_limit_becomes_a_dead_letter(typed, rabbitmq_url, sessions):
    """What a too-low ``delivery-limit`` does: each connection that closes while holding the
    message (a killed worker, a deploy, a lost node, a consumer timeout) returns it and counts one
    delivery; past the limit RabbitMQ dead-letters it into ``.XQ``, and the sweep stores it."""
    broker = typed("quorum")
    declare_queues(broker, [BUILD_REPORT.queue])
    set_policy(rabbitmq_url, "^bulk$", '{"delivery-limit": 1}')
    send(broker, BUILD_REPORT, ReportJob(PERIOD, 7, "v1").payload())

    for returned in ((1, 0, 0), (0, 0, 1)):
        holder = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        method, _properties, _body = holder.channel().basic_get(BUILD_REPORT.queue, auto_ack=False)
        assert method is not None
        holder.close()
        # RabbitMQ takes the message back once it has handled the closed connection.
        wait_until(lambda r=returned: queue_depths(rabbitmq_url, BUILD_REPORT.queue) == r, timeout=10)

    assert absorb_rabbitmq_dead_letters(broker, DeadLetterSink(sessions, alerts=None)) == 1
    with sessions() as session:
        [letter] = session.scalars(select(DeadLetter))
    assert (letter.reason, letter.queue, letter.user_id) == (DeadLetterReason.BROKER, BUILD_REPORT.queue, 7)


def test_the_depths_are_read_while_pika_logs_at_info(typed, rabbitmq_url, caplog) -> None:
    # A process that logs at INFO (the exporter, the scheduler) sees pika's channel log lines,
    # whose arguments are pika's own objects: comparing them while asking about the queues
    # raised, and aborted the connection.
    queue_for(typed("classic")).send_jobs(BUILD_REPORT, [ReportJob(PERIOD, 1, "v1").payload()])
    caplog.set_level("INFO", logger="pika")
    depths = rabbitmq.ready_counts_at(rabbitmq_url, [BUILD_REPORT.queue], queue_type="classic")
    assert depths == {BUILD_REPORT.queue: (1, 0, 0)}
