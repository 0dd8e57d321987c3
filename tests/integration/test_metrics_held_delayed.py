"""Delayed messages (retries, deferrals) a worker has taken from a queue's delay queue and holds
until due are still waiting: the exporter counts them as ``delayed``, as the backlog does."""

from __future__ import annotations

import time

import dramatiq
import redis
from sqlalchemy.orm import Session, sessionmaker

from reports.delivery.breaker import mail_breaker_name
from reports.jobs import BUILD_REPORT
from reports.ops.metrics import ReportsCollector
from reports.settings import Settings
from reports.worker import held
from reports.worker.broker import build_broker
from tests.integration.test_metrics_period_gauges import gauge, redis_collector

QUEUE = BUILD_REPORT.queue


def test_on_redis_a_delayed_message_a_worker_holds_until_due_is_delayed(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    broker = build_broker(settings)
    try:
        broker.declare_queue(QUEUE)
        message = dramatiq.Message(queue_name=QUEUE, actor_name=BUILD_REPORT.name, args=(), kwargs={}, options={})
        broker.enqueue(message, delay=600_000)
        collector = redis_collector(settings, sessions, QUEUE)
        assert gauge(collector, "reports_queue_messages")[(QUEUE, "delayed")] == 1

        # A worker's delay-queue consumer takes it, to hold it until it is due.
        consumer = broker.consume(f"{QUEUE}{held.DELAY_SUFFIX}", prefetch=1, timeout=1000)
        try:
            assert next(consumer) is not None
            depths = gauge(collector, "reports_queue_messages")
            assert depths[(QUEUE, "delayed")] == 1
            assert depths[(QUEUE, "ready")] == depths[(QUEUE, "in_progress")] == 0
        finally:
            consumer.close()
    finally:
        broker.close()


def test_on_rabbitmq_and_sqs_delayed_messages_workers_hold_until_due_are_added_to_the_brokers_delayed(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    client = redis.Redis.from_url(settings.broker_url)
    holding = held.HeldMessages()
    now_ms = int(time.time() * 1000)
    for _ in range(3):
        holding.hold(object(), f"{QUEUE}{held.DELAY_SUFFIX}", now_ms, waiting=False)
    holding.hold(object(), QUEUE, now_ms, waiting=True)
    held.Publisher(holding, client, namespace=settings.broker_namespace, process="w1").publish_if_due(force=True)
    collector = ReportsCollector(
        client,
        namespace=settings.broker_namespace,
        sessions=sessions,
        queues=(QUEUE,),
        breaker_name=mail_breaker_name(settings.broker_namespace),
        # The broker's own counts: 5 ready, 2 delayed, none dead.
        broker_depths=lambda queues: {queue: (5, 2, 0) for queue in queues},
    )

    depths = gauge(collector, "reports_queue_messages")

    assert depths[(QUEUE, "ready")] == 5
    assert depths[(QUEUE, "delayed")] == 2 + 3
    assert depths[(QUEUE, "in_progress")] == 1
