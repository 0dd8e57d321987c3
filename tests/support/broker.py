"""What Redis holds and ran: the messages in the broker's queues, and a server's command counts.

``queue_counts`` and ``queued_messages`` count RabbitMQ's queues too, for an amqp:// or amqps://
broker URL (in its vhost, tests/support/rabbitmq.py), and ``held_on_rabbitmq`` what its workers
hold; the other helpers read Redis only.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TypeVar

import redis

from reports.jobs import CoordinatorJob, ReportJob, SendNowJob
from reports.settings import Settings
from reports.worker import held
from tests.support.rabbitmq import queue_depths


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


def held_on_rabbitmq(settings: Settings, queue: str) -> int:
    """Messages of ``queue`` (delayed ones included) that live RabbitMQ workers hold, as their
    snapshots in the shared Redis say (reports/worker/held.py)."""
    client = redis.Redis.from_url(settings.shared_redis_url)
    return held.held_of(held.read(client, settings.broker_namespace), queue)
