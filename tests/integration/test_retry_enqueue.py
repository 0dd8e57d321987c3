"""A retry or deferral whose enqueue fails is never acked away: the worker waits for Redis."""

from __future__ import annotations

import shutil
import threading

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker

from reports.errors import ProviderUnavailable
from reports.worker.retries import JitteredRetries
from tests.support.environment import missing
from tests.support.processes import free_port, redis_server


def test_a_retry_that_cannot_be_enqueued_holds_the_message_until_redis_is_back(tmp_path):
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed")
    port = free_port()
    with redis_server(tmp_path, port=port) as url:
        broker = RedisBroker(url=url, namespace="retry-test")
        retries = JitteredRetries(max_retries=5, min_backoff_ms=10, max_backoff_ms=20, on_dead=lambda _dead: None)
        message = MessageProxy(
            dramatiq.Message(
                queue_name="bulk", actor_name="build_report", args=("2026-10", 7, "v1"), kwargs={}, options={}
            )
        )
    # The server is gone (a failover): the enqueue of the retry fails.

    hook = threading.Thread(
        target=retries.after_process_message,
        args=(broker, message),
        kwargs={"exception": ProviderUnavailable()},
        daemon=True,
    )
    hook.start()
    hook.join(timeout=1.5)
    # Dramatiq acks the message as soon as this hook returns: it must not return while Redis is away.
    assert hook.is_alive(), "the retry middleware gave up on the enqueue and let the message be acked"

    with redis_server(tmp_path, port=port):
        hook.join(timeout=10)
        assert not hook.is_alive()
        client = redis.Redis(port=port)
        [redis_id] = client.lrange("retry-test:bulk.DQ", 0, -1)
        retried = dramatiq.Message.decode(client.hget("retry-test:bulk.DQ.msgs", redis_id))
        assert (retried.message_id, retried.args, retried.options["retries"]) == (
            message.message_id,
            ("2026-10", 7, "v1"),
            1,
        )
