"""What Redis holds and ran: the messages in the broker's queues, and a server's command counts.

``queue_counts``, ``queued_messages``, ``dead_in_broker`` and ``publish_raw`` work on RabbitMQ too,
for an amqp:// or amqps:// broker URL (in its vhost, tests/support/rabbitmq.py); the other helpers
read Redis only.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any, TypeVar

import dramatiq
import redis

from reports.jobs import CoordinatorJob, ReportJob, SendNowJob
from reports.settings import Settings
from tests.support.rabbitmq import publish, queue_depths


def redis_commands(client: redis.Redis) -> Counter[str]:
    """Commands the server has run since it started, by name (``INFO commandstats``), not counting
    INFO itself: on a private server, the difference of two readings is what ran in between."""
    stats = client.info("commandstats")
    return Counter(
        {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items() if name != "cmdstat_info"}
    )


def queue_counts(settings: Settings) -> dict[str, int]:
    """Messages waiting in the default and bulk queues of the test's namespace (Redis) or vhost (RabbitMQ)."""
    return {
        queue: queued_messages(settings.broker_url, settings.broker_namespace, queue) for queue in ("default", "bulk")
    }


def messages_in_queue(settings: Settings, queue: str) -> list[dict]:
    """The decoded messages ready in ``queue``, in queue order."""
    client = redis.Redis.from_url(settings.broker_url)
    key = f"{settings.broker_namespace}:{queue}"
    return [json.loads(client.hget(f"{key}.msgs", message_id)) for message_id in client.lrange(key, 0, -1)]


JobT = TypeVar("JobT", CoordinatorJob, ReportJob, SendNowJob)


def jobs_in_queue(settings: Settings, queue: str, job: type[JobT]) -> list[JobT]:
    """The messages ready in ``queue``, parsed into jobs as their actor parses them."""
    return [job.parse(m["args"], m["kwargs"]) for m in messages_in_queue(settings, queue)]


def queued_messages(redis_url: str, namespace: str, queue: str) -> int:
    """Messages waiting in ``queue`` (ready and delayed).

    ``redis_url`` may be an amqp:// or amqps:// URL: then they are counted in RabbitMQ, in that URL's
    vhost, and ``namespace`` is not used (Dramatiq's RabbitMQ broker has none).
    """
    if redis_url.startswith(("amqp://", "amqps://")):
        ready, delayed, _dead = queue_depths(redis_url, queue)
        return ready + delayed
    client = redis.Redis.from_url(redis_url)
    return client.llen(f"{namespace}:{queue}") + client.llen(f"{namespace}:{queue}.DQ")


def dead_in_broker(settings: Settings, queues: tuple[str, ...] = ("default", "bulk")) -> int:
    """Messages still in the broker's own dead-letter queues (``<queue>.XQ``), which the workers
    move into the dead-letter table: a message left there is one an operator would not see."""
    if settings.broker_is_rabbitmq:
        return sum(queue_depths(settings.broker_url, queue)[2] for queue in queues)
    client = redis.Redis.from_url(settings.broker_url)
    return sum(client.zcard(f"{settings.broker_namespace}:{queue}.XQ") for queue in queues)


def publish_raw(settings: Settings, message: dramatiq.Message[Any]) -> None:
    """Put ``message`` on its queue as its bytes alone, as another producer (an older deploy, another
    service) would: past this process's broker object and its middleware.

    On Redis what Dramatiq's dispatch script writes: the message under a fresh ``redis_message_id``
    in the queue's hash, that id on the queue's list. On RabbitMQ a persistent publish to the queue,
    which must exist (the workers declare it when they boot).
    """
    if settings.broker_is_rabbitmq:
        publish(settings.broker_url, message.queue_name, message.encode())
        return
    redis_id = str(uuid.uuid4())  # as RedisBroker.enqueue draws it: the message id is not reused
    body = message.copy(options={**message.options, "redis_message_id": redis_id}).encode()
    key = f"{settings.broker_namespace}:{message.queue_name}"
    with redis.Redis.from_url(settings.broker_url).pipeline(transaction=True) as pipe:
        pipe.hset(f"{key}.msgs", redis_id, body)
        pipe.rpush(key, redis_id)
        pipe.execute()
