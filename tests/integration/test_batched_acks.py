"""The workers' consumer writes acks in batches: none is left unwritten once the queue is idle or
the worker stops, and a batch never deletes a message another process holds."""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
import redis

from reports.settings import Settings
from reports.worker import consumer
from reports.worker.broker import build_broker
from tests.support.processes import free_port, redis_server
from tests.support.waiting import wait_until

QUEUE = "acks-test"


def keys_left(client: redis.Redis, namespace: str) -> dict[str, int]:
    """Messages still fetched-but-unacked (every ack set of the queue) and bodies still stored."""
    acked = sum(client.scard(key) for key in client.scan_iter(match=f"{namespace}:__acks__.*.{QUEUE}"))
    return {"unacked": acked, "bodies": client.hlen(f"{namespace}:{QUEUE}.msgs")}


@pytest.fixture
def pool(settings: Settings):  # type: ignore[no-untyped-def]
    broker = build_broker(settings)
    ran: list[int] = []
    lock = threading.Lock()

    @dramatiq.actor(queue_name=QUEUE, broker=broker)
    def record(index: int) -> None:
        with lock:
            ran.append(index)

    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_threads=4, worker_timeout=100)
    yield broker, record, worker, ran
    worker.stop()
    broker.close()


def test_every_ack_is_written_once_the_queue_is_idle(pool, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    broker, record, worker, ran = pool
    for index in range(consumer.ACK_BATCH * 2 + 37):  # whole batches and a part of one
        record.send(index)
    worker.start()
    wait_until(lambda: len(ran) == consumer.ACK_BATCH * 2 + 37, timeout=30, what="every message to run")
    client = redis.Redis.from_url(settings.broker_url)
    wait_until(
        lambda: keys_left(client, settings.broker_namespace) == {"unacked": 0, "bodies": 0},
        timeout=3,
        what="the last acks to be written",
    )
    assert sorted(ran) == list(range(consumer.ACK_BATCH * 2 + 37))


def test_a_stopping_worker_writes_the_acks_it_holds(pool, settings: Settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(consumer, "ACK_DELAY_SECONDS", 3600.0)  # only a full batch or the stop writes
    broker, record, worker, ran = pool
    for index in range(7):
        record.send(index)
    worker.start()
    wait_until(lambda: len(ran) == 7, timeout=30, what="every message to run")
    worker.stop()
    client = redis.Redis.from_url(settings.broker_url)
    assert keys_left(client, settings.broker_namespace) == {"unacked": 0, "bodies": 0}


def test_a_late_ack_leaves_alone_a_message_this_process_no_longer_holds(settings: Settings) -> None:
    # A message requeued from a process thought dead may be running elsewhere: its body stays.
    broker = build_broker(settings)
    client = redis.Redis.from_url(settings.broker_url)
    ns = settings.broker_namespace
    client.hset(f"{ns}:{QUEUE}.msgs", mapping={"held": b"{}", "requeued": b"{}"})
    client.sadd(f"{ns}:__acks__.{broker.broker_id}.{QUEUE}", "held")
    reader = consumer.Consumer(broker, QUEUE, prefetch=1, timeout=100)
    for redis_id in ("held", "requeued"):
        reader.ack(dramatiq.broker.MessageProxy(dramatiq.Message(QUEUE, "a", (), {}, {"redis_message_id": redis_id})))
    reader.close()
    assert client.hkeys(f"{ns}:{QUEUE}.msgs") == [b"requeued"]
    broker.close()


def test_acks_that_redis_could_not_take_are_kept_without_raising_and_written_by_the_next_consumer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Dramatiq drops a consumer that raises, with the delayed messages its thread held; one whose
    # connection failed all the same is followed by another: the acks the first held must not
    # stay unwritten (their ids would sit in this live process's ack set for good).
    port = free_port()
    with redis_server(tmp_path, port=port) as url:
        settings = Settings(broker_url=url, broker_namespace="acks")
        broker = build_broker(settings)
        client = redis.Redis.from_url(url)
        client.hset(f"acks:{QUEUE}.msgs", mapping={"a": b"{}", "b": b"{}"})
        client.sadd(f"acks:__acks__.{broker.broker_id}.{QUEUE}", "a", "b")
        first = consumer.Consumer(broker, QUEUE, prefetch=1, timeout=100)
        for redis_id in ("a", "b"):
            first.ack(
                dramatiq.broker.MessageProxy(dramatiq.Message(QUEUE, "a", (), {}, {"redis_message_id": redis_id}))
            )
    # Redis is gone: the write fails, and is kept for later.
    first.close()
    with redis_server(tmp_path, port=port):
        client = redis.Redis(port=port)
        client.hset(f"acks:{QUEUE}.msgs", mapping={"a": b"{}", "b": b"{}"})
        client.sadd(f"acks:__acks__.{broker.broker_id}.{QUEUE}", "a", "b")
        second = consumer.Consumer(broker, QUEUE, prefetch=1, timeout=100)
        second.close()
        assert keys_left(client, "acks") == {"unacked": 0, "bodies": 0}
    broker.close()


def test_under_load_a_fetch_brings_a_batch_not_the_one_message_an_ack_made_room_for(settings: Settings) -> None:
    broker = build_broker(settings)
    ran: list[int] = []
    lock = threading.Lock()

    @dramatiq.actor(queue_name=QUEUE, broker=broker)
    def slow(index: int) -> None:
        # A report's send, of uneven length: the threads stay busy and finish one at a time.
        time.sleep(0.005 + (index * 7919 % 31) / 1000)
        with lock:
            ran.append(index)

    fetched: list[int] = []
    do_fetch = broker.do_fetch

    def counted_fetch(queue_name: str, count: int) -> list[bytes]:
        messages = do_fetch(queue_name, count)
        if messages and queue_name == QUEUE:
            fetched.append(len(messages))
        return messages

    broker.do_fetch = counted_fetch  # type: ignore[method-assign]
    messages = 300
    for index in range(messages):
        slow.send(index)
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        wait_until(lambda: len(ran) == messages, timeout=60, what="every message to run")
    finally:
        worker.stop()
        broker.close()

    assert sorted(ran) == list(range(messages))
    # Prefetch 8 (two per thread): a fetch waits until 2 are spent, so it brings at least 2.
    # Prefetch 8 (two per thread): a fetch waits until 2 are spent, so it brings at least 2; only
    # the last ones, when the queue runs dry, may bring fewer.
    assert min(fetched[:-3]) >= 2, f"{len(fetched)} fetches for {messages} messages: {fetched}"
