"""A Redis worker whose connection fails keeps what its consumers held: the consumer Dramatiq
starts after the one it dropped writes the acks and runs the delayed messages when due."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis

from reports.settings import Settings
from reports.worker.broker import build_broker
from reports.worker.held import DELAY_SUFFIX
from tests.support.proxy import TcpProxy, tcp_proxy
from tests.support.waiting import wait_until

QUEUE = "handover-test"
#: When the deferred message is due, in milliseconds after it is sent.
DUE_MS = 3000


@pytest.fixture
def proxied(redis_url: str, broker_namespace: str, tmp_path: Path) -> Iterator[tuple[Settings, TcpProxy]]:
    """Settings whose broker is the test's Redis behind a proxy the test can cut."""
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    with tcp_proxy(port) as proxy:
        yield (
            Settings(
                var_dir=tmp_path / "var",
                broker_url=f"redis://127.0.0.1:{proxy.port}/0",
                broker_namespace=broker_namespace,
            ),
            proxy,
        )


@pytest.fixture
def pool(proxied: tuple[Settings, TcpProxy]):  # type: ignore[no-untyped-def]
    settings, _proxy = proxied
    broker = build_broker(settings)
    ran: list[float] = []
    lock = threading.Lock()

    @dramatiq.actor(queue_name=QUEUE, broker=broker)
    def record() -> None:
        with lock:
            ran.append(time.monotonic())

    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_threads=2, worker_timeout=100)
    yield broker, record, worker, ran
    worker.stop()
    broker.close()


def wait_until_held(broker: dramatiq.Broker) -> None:
    """Wait until the worker's delay-queue consumer has handed the deferral out, which is when this
    process holds it: fetched alone, it could still be in flight to the worker when the test acts,
    in Redis's ack set and in no consumer (only the process's end requeues such a message, and the
    items' own repair covers it, not these tests)."""
    wait_until(
        lambda: broker.held.counts().get(f"{QUEUE}{DELAY_SUFFIX}") == 1,  # type: ignore[attr-defined]
        timeout=5,
        what="the worker to hold the deferral",
    )


def delay_acks(broker_namespace: str, broker: dramatiq.Broker) -> str:
    """The worker's ack set of the delay queue: what it fetched from there and has not acked."""
    return f"{broker_namespace}:__acks__.{broker.broker_id}.{QUEUE}{DELAY_SUFFIX}"  # type: ignore[attr-defined]


def test_a_deferred_message_runs_when_due_though_redis_dropped_the_connection_meanwhile(
    pool, proxied, redis_url: str, broker_namespace: str
) -> None:  # type: ignore[no-untyped-def]
    broker, record, worker, ran = pool
    _settings, proxy = proxied
    client = redis.Redis.from_url(redis_url)
    worker.start()
    record.send_with_options(delay=DUE_MS)
    sent = time.monotonic()
    wait_until_held(broker)
    assert client.scard(delay_acks(broker_namespace, broker)) == 1

    # Redis goes away for a moment: Dramatiq drops the consumers, with the delay queue's messages.
    proxy.cut()
    time.sleep(0.5)
    proxy.restore()

    wait_until(lambda: ran, timeout=DUE_MS / 1000 + 6, what="the deferral to run")
    assert ran[0] - sent >= DUE_MS / 1000
    wait_until(
        lambda: client.scard(delay_acks(broker_namespace, broker)) == 0,
        timeout=3,
        what="its ack to be written",
    )


def test_a_stopping_worker_requeues_the_deferrals_it_holds(pool, redis_url: str, broker_namespace: str) -> None:  # type: ignore[no-untyped-def]
    broker, record, worker, ran = pool
    client = redis.Redis.from_url(redis_url)
    worker.start()
    message = record.send_with_options(delay=60_000)
    wait_until_held(broker)
    assert client.scard(delay_acks(broker_namespace, broker)) == 1

    worker.stop()

    assert client.lrange(f"{broker_namespace}:{QUEUE}.DQ", 0, -1) == [message.options["redis_message_id"].encode()]
    assert client.scard(delay_acks(broker_namespace, broker)) == 0
    assert ran == []


def test_a_consumer_dropped_while_it_hands_back_its_predecessors_deferrals_passes_on_all_of_them(
    redis_url: str, broker_namespace: str, tmp_path: Path
) -> None:
    broker = build_broker(Settings(var_dir=tmp_path / "var", broker_url=redis_url, broker_namespace=broker_namespace))
    queue = f"{QUEUE}{DELAY_SUFFIX}"
    deferred = [
        dramatiq.broker.MessageProxy(
            dramatiq.Message(queue_name=queue, actor_name="record", args=(), kwargs={}, options={"redis_message_id": n})
        )
        for n in ("r0", "r1", "r2", "r3", "r4")
    ]
    broker.handover(queue).delayed = list(deferred)  # type: ignore[attr-defined]
    # The next consumer takes them over and hands them out one a turn; it is dropped after the first.
    consumer = broker.consume(queue, prefetch=10, timeout=100)
    assert next(consumer) is deferred[0]
    consumer.close()

    after = broker.consume(queue, prefetch=10, timeout=100)
    handed = [next(after) for _ in deferred]
    assert [message.options["redis_message_id"] for message in handed] == ["r0", "r1", "r2", "r3", "r4"]
    after.close()
    broker.close()
