"""A retry or deferral whose enqueue fails is never acked away: the worker waits for Redis."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from reports.errors import ProviderUnavailable
from reports.worker.retries import JitteredRetries
from tests.support.environment import missing
from tests.support.processes import free_port, redis_server


def retrying() -> JitteredRetries:
    return JitteredRetries(max_retries=5, min_backoff_ms=10, max_backoff_ms=20, on_dead=lambda _dead: None)


def failed_message() -> MessageProxy:
    """A report's message whose actor just failed, to be retried."""
    return MessageProxy(
        dramatiq.Message(queue_name="bulk", actor_name="build_report", args=("2026-10", 7, "v1"), kwargs={}, options={})
    )


@contextmanager
def back_after_the_wait(tmp_path: Path, port: int, hook: threading.Thread, why: str) -> Iterator[redis.Redis]:
    """Start ``hook`` with Redis away, check it still waits a moment later (``why`` if not), then
    bring Redis back on ``port`` and wait for the hook to end; a client of that Redis."""
    hook.start()
    hook.join(timeout=1.5)
    assert hook.is_alive(), f"{why}, and Dramatiq would ack the message with no copy"
    with redis_server(tmp_path, port=port):
        hook.join(timeout=10)
        assert not hook.is_alive()
        yield redis.Redis(port=port)


def test_a_retry_that_cannot_be_enqueued_holds_the_message_until_redis_is_back(tmp_path):
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed")
    port = free_port()
    with redis_server(tmp_path, port=port) as url:
        broker = RedisBroker(url=url, namespace="retry-test")
        retries, message = retrying(), failed_message()
    # The server is gone (a failover): the enqueue of the retry fails.

    hook = threading.Thread(
        target=retries.after_process_message,
        args=(broker, message),
        kwargs={"exception": ProviderUnavailable()},
        daemon=True,
    )
    # Dramatiq acks the message as soon as this hook returns: it must not return while Redis is away.
    with back_after_the_wait(tmp_path, port, hook, "the retry middleware gave up on the enqueue") as client:
        [redis_id] = client.lrange("retry-test:bulk.DQ", 0, -1)
        retried = dramatiq.Message.decode(client.hget("retry-test:bulk.DQ.msgs", redis_id))
        assert (retried.message_id, retried.args, retried.options["retries"]) == (
            message.message_id,
            ("2026-10", 7, "v1"),
            1,
        )


def test_the_actors_time_limit_does_not_cut_the_wait_for_redis_to_take_the_retry(tmp_path):
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed")
    port = free_port()
    time_limit = TimeLimit(time_limit=300, interval=50)
    with redis_server(tmp_path, port=port) as url:
        broker = RedisBroker(url=url, namespace="retry-test", middleware=[time_limit])
        retries, message = retrying(), failed_message()
    time_limit.after_process_boot(broker)

    def the_actor_failed() -> None:
        # The actor's 300 ms started when it did; Redis is away as its retry is enqueued.
        time_limit.manager.add_timeout(threading.get_ident(), 300)
        retries.after_process_message(broker, message, exception=ProviderUnavailable())

    hook = threading.Thread(target=the_actor_failed, daemon=True)
    with back_after_the_wait(tmp_path, port, hook, "the time limit ended the wait") as client:
        assert client.llen("retry-test:bulk.DQ") == 1


def test_a_retry_redis_refuses_for_want_of_memory_sends_the_message_to_the_dead_letters(tmp_path):
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed")
    with redis_server(tmp_path, port=free_port()) as url:
        client = redis.Redis.from_url(url)
        client.set("filler", "x" * 100_000)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)  # every write is refused: OOM
        broker = RedisBroker(url=url, namespace="retry-test")
        retries, message = retrying(), failed_message()

        retries.after_process_message(broker, message, exception=ProviderUnavailable())

        # Failed, Dramatiq nacks it into the broker's dead-letter queue instead of acking it away.
        assert message.failed
        client.config_set("maxmemory", 0)
