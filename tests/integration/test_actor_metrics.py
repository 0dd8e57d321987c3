"""Actor metrics on a real Redis: counted in process memory, written once a second, nothing lost.

Round trips are counted with ``INFO commandstats`` on a redis-server of the test's own: each flush
is one MULTI/EXEC, so the EXEC count is the number of round trips.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from dramatiq import Message, Worker
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from redis.backoff import NoBackoff
from redis.retry import Retry

from reports.counters import SEP, counter_key
from reports.worker.actor_metrics import ActorMetrics
from tests.support.broker import redis_commands
from tests.support.processes import free_port
from tests.support.waiting import wait_until

NAMESPACE = "metrics-test"
#: Longer than any test: the flusher thread never runs, so the test decides when a flush happens.
NEVER = 3600.0


@pytest.fixture
def client(private_redis: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(private_redis)
    yield client
    client.close()


def outcomes(client: redis.Redis) -> dict[str, int]:
    raw = client.hgetall(counter_key(NAMESPACE, "actor_outcomes"))
    return {field.decode(): int(value) for field, value in raw.items()}


def timed(client: redis.Redis, actor: str) -> int:
    raw = client.hgetall(counter_key(NAMESPACE, "actor_duration_buckets"))
    return sum(int(value) for field, value in raw.items() if field.decode().split(SEP)[0] == actor)


def process(metrics: ActorMetrics, count: int, *, actor: str = "build_report") -> None:
    """Run ``count`` messages through the middleware's hooks, as a worker thread does."""
    broker = StubBroker()
    for _ in range(count):
        message = MessageProxy(Message(queue_name="bulk", actor_name=actor, args=(), kwargs={}, options={}))
        metrics.before_process_message(broker, message)
        metrics.after_process_message(broker, message, result=None)


def test_a_hundred_messages_through_a_worker_make_at_most_two_round_trips_and_are_all_counted(
    client: redis.Redis,
) -> None:
    broker = StubBroker()
    broker.add_middleware(ActorMetrics(client, namespace=NAMESPACE))

    @dramatiq.actor(broker=broker, queue_name="bulk", actor_name="build_report")
    def build_report(index: int) -> None:
        pass

    client.ping()  # the connection, opened now, is not the messages' cost
    before = redis_commands(client)
    worker = Worker(broker, worker_threads=4)
    worker.start()
    try:
        for index in range(100):
            build_report.send(index)
        broker.join("bulk")
        worker.join()
        done = time.monotonic()
        wait_until(
            lambda: timed(client, "build_report") == 100, timeout=1.5, interval=0.02, what="the counts to be flushed"
        )
        within = time.monotonic() - done
    finally:
        worker.stop()

    assert outcomes(client) == {f"build_report{SEP}success": 100}
    total = float(client.hget(counter_key(NAMESPACE, "actor_duration_sum"), "build_report") or 0)
    assert 0 < total < 10
    ran = redis_commands(client) - before
    # Beside the flushes: the test's own reads, and the greeting of the flusher's connection.
    assert set(ran) <= {"multi", "exec", "hincrby", "hincrbyfloat", "hgetall", "hget", "hello"}, ran
    assert 1 <= ran["exec"] <= 2, ran
    # One command per hash field and flush (outcome, bucket, sum), not one per message.
    assert ran["hincrby"] + ran["hincrbyfloat"] <= 2 * 4, ran
    print(f"100 messages: {ran['exec']} round trip(s), counted in Redis {within:.2f} s after the last")


def test_counts_are_written_once_a_second_without_a_flush_being_asked_for(client: redis.Redis) -> None:
    metrics = ActorMetrics(client, namespace=NAMESPACE)
    try:
        process(metrics, 5)
        assert outcomes(client) == {}  # nothing per message

        wait_until(
            lambda: outcomes(client) == {f"build_report{SEP}success": 5},
            timeout=1.5,
            interval=0.02,
            what="the flusher's first write",
        )
    finally:
        metrics.after_worker_shutdown(StubBroker(), None)  # type: ignore[arg-type]


def test_a_flush_that_cannot_reach_redis_keeps_its_counts_for_the_next(client: redis.Redis) -> None:
    unreachable = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))  # fails at once
    metrics = ActorMetrics(unreachable, namespace=NAMESPACE, flush_interval_seconds=NEVER)
    process(metrics, 10)

    assert metrics.flush() is False
    assert metrics.flush() is False  # and again: still nothing lost

    metrics.client = client  # Redis is back
    process(metrics, 5, actor="deliver_report")
    assert metrics.flush() is True

    assert outcomes(client) == {f"build_report{SEP}success": 10, f"deliver_report{SEP}success": 5}
    assert (timed(client, "build_report"), timed(client, "deliver_report")) == (10, 5)
    assert metrics.flush() is True  # nothing more to write, and nothing counted twice
    assert outcomes(client) == {f"build_report{SEP}success": 10, f"deliver_report{SEP}success": 5}
    metrics.after_worker_shutdown(StubBroker(), None)  # type: ignore[arg-type]


def test_worker_shutdown_writes_what_the_last_interval_counted(client: redis.Redis) -> None:
    broker = StubBroker()
    metrics = ActorMetrics(client, namespace=NAMESPACE, flush_interval_seconds=NEVER)
    broker.add_middleware(metrics)

    @dramatiq.actor(broker=broker, queue_name="bulk", actor_name="build_report")
    def build_report(index: int) -> None:
        pass

    worker = Worker(broker, worker_threads=2)
    worker.start()
    for index in range(7):
        build_report.send(index)
    broker.join("bulk")
    worker.join()
    assert outcomes(client) == {}

    worker.stop()

    assert outcomes(client) == {f"build_report{SEP}success": 7}
    assert timed(client, "build_report") == 7


def test_a_forked_process_writes_its_own_counts_and_not_its_parents(client: redis.Redis, private_redis: str) -> None:
    metrics = ActorMetrics(client, namespace=NAMESPACE, flush_interval_seconds=NEVER)
    process(metrics, 10)  # not yet flushed when the worker process forks

    def child() -> None:
        metrics.client = redis.Redis.from_url(private_redis)  # a connection of its own, as after import
        process(metrics, 3, actor="deliver_report")
        metrics.after_worker_shutdown(StubBroker(), None)  # type: ignore[arg-type]

    forked = multiprocessing.get_context("fork").Process(target=child)
    forked.start()
    forked.join(timeout=30)
    assert forked.exitcode == 0
    assert outcomes(client) == {f"deliver_report{SEP}success": 3}

    metrics.after_worker_shutdown(StubBroker(), None)  # type: ignore[arg-type]
    assert outcomes(client) == {f"build_report{SEP}success": 10, f"deliver_report{SEP}success": 3}
