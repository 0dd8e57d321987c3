"""The RabbitMQ test helpers against a real node: a vhost of the test's own, made and deleted, and the
messages counted in it (tests/support/rabbitmq.py, and the amqp side of tests/support/broker.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import cast
from urllib.parse import urlsplit

import dramatiq
import pika
import pika.exceptions
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from reports.settings import Settings
from tests.support.broker import queue_counts, queued_messages
from tests.support.environment import IN_CI, RABBITMQ_URL
from tests.support.processes import free_port
from tests.support.rabbitmq import queue_depths, temporary_vhost


@contextmanager
def channel(url: str) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A channel whose publishes the broker has routed by the time ``basic_publish`` returns."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        opened = connection.channel()
        opened.confirm_delivery()
        yield opened
    finally:
        connection.close()


def publish(url: str, counts: dict[str, int]) -> None:
    """Declare each queue in ``counts`` and publish that many messages to it."""
    with channel(url) as opened:
        for queue, count in counts.items():
            opened.queue_declare(queue, durable=True)
            for n in range(count):
                opened.basic_publish("", queue, f"{queue} {n}".encode())


def vhost_exists(url: str) -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(url)).close()
    except pika.exceptions.ProbableAccessDeniedError as e:
        # The broker refuses the connection: 530 NOT_ALLOWED, "vhost … not found".
        assert "not found" in str(e), e
        return False
    return True


def test_a_temporary_vhost_is_the_tests_own_and_is_deleted_with_its_queues_after() -> None:
    admin = urlsplit(RABBITMQ_URL)
    with temporary_vhost() as url:
        parts = urlsplit(url)
        assert re.fullmatch(r"/test-[0-9a-f]{12}", parts.path), url
        assert (parts.scheme, parts.netloc) == (admin.scheme, admin.netloc)
        assert vhost_exists(url)
        publish(url, {"bulk": 1})
        assert queue_depths(url, "bulk") == (1, 0, 0)
    assert not vhost_exists(url)


def test_queue_depths_counts_ready_delayed_and_dead_messages_in_the_queues_dramatiq_names(
    rabbitmq_url: str,
) -> None:
    broker = RabbitmqBroker(url=rabbitmq_url, confirm_delivery=True, middleware=[])
    try:

        @dramatiq.actor(broker=broker, queue_name="bulk")
        def build_report(user_id: int) -> None:
            raise AssertionError("no worker runs in this test")

        build_report.send(1)
        build_report.send(2)
        build_report.send_with_options(args=(3,), delay=60_000)
    finally:
        broker.close()
    publish(rabbitmq_url, {"default.XQ": 1})
    # Dramatiq declared bulk, bulk.DQ and bulk.XQ; nothing but default.XQ was declared for default.
    assert queue_depths(rabbitmq_url, "bulk") == (2, 1, 0)
    # The first two passive declares find nothing (the broker closes the channel on each 404).
    assert queue_depths(rabbitmq_url, "default") == (0, 0, 1)
    assert queue_depths(rabbitmq_url, "nowhere") == (0, 0, 0)
    # The broker helpers count ready and delayed messages, not dead ones; RabbitMQ has no namespace.
    assert queued_messages(rabbitmq_url, "ignored", "bulk") == 3
    assert queued_messages(rabbitmq_url, "ignored", "default") == 0
    # queue_counts reads only these two fields: a stand-in, not a whole Settings, is enough.
    settings = cast(Settings, SimpleNamespace(broker_url=rabbitmq_url, broker_namespace="ignored"))
    assert queue_counts(settings) == {"default": 0, "bulk": 3}


def test_two_temporary_vhosts_do_not_see_each_others_messages(rabbitmq_url: str) -> None:
    with temporary_vhost() as other_url:
        assert other_url != rabbitmq_url
        publish(rabbitmq_url, {"bulk": 2, "default": 1})
        publish(other_url, {"bulk": 1})
        assert queue_depths(rabbitmq_url, "bulk") == (2, 0, 0)
        assert queue_depths(other_url, "bulk") == (1, 0, 0)
        assert queue_depths(rabbitmq_url, "default") == (1, 0, 0)
        assert queue_depths(other_url, "default") == (0, 0, 0)


def test_an_unreachable_rabbitmq_skips_locally_and_fails_in_ci() -> None:
    outcome = pytest.fail.Exception if IN_CI else pytest.skip.Exception
    with (
        pytest.raises(outcome, match="RabbitMQ at 127.0.0.1:.* is not reachable"),
        temporary_vhost(f"amqp://guest:guest@127.0.0.1:{free_port()}"),
    ):
        pytest.fail("no vhost should have been made")
