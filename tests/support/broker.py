"""What Redis holds and ran: the messages in the broker's queues, and a server's command counts.

``queue_counts``, ``queued_messages``, ``dead_in_broker`` and the ``publish_*`` helpers work on
RabbitMQ and SQS too, for an amqp:// or amqps:// broker URL (in its vhost, tests/support/rabbitmq.py)
or an sqs:// one (its prefix, tests/support/sqs.py), and ``held_by_workers`` counts what their
workers hold; the other helpers read Redis only.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections import Counter
from typing import Any, TypeVar

import dramatiq
import pika
import redis

from reports.jobs import CoordinatorJob, ReportJob, SendNowJob
from reports.settings import Settings
from reports.worker import held
from reports.worker.broker import build_broker
from tests.support import sqs as sqs_support
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
    vhost, or an sqs:// URL: then in SQS, under its prefix; ``namespace`` is then not used.
    """
    if redis_url.startswith(("amqp://", "amqps://")):
        ready, delayed, _dead = queue_depths(redis_url, queue)
        return ready + delayed
    if redis_url.startswith("sqs://"):
        ready, delayed, _in_flight, _dead = sqs_support.queue_depths(redis_url, queue)
        return ready + delayed
    client = redis.Redis.from_url(redis_url)
    return client.llen(f"{namespace}:{queue}") + client.llen(f"{namespace}:{queue}.DQ")


def held_by_workers(settings: Settings, queue: str) -> int:
    """Messages of ``queue`` (delayed ones included) that RabbitMQ or SQS workers hold: on RabbitMQ
    the live ones, as their snapshots in the shared Redis say (reports/worker/held.py); on SQS
    what it counts in flight (received and not deleted, a dead worker's too)."""
    if settings.broker_is_sqs:
        return sqs_support.queue_depths(settings.broker_url, queue)[2]
    client = redis.Redis.from_url(settings.shared_redis_url)
    return held.held_of(held.read(client, settings.broker_namespace), queue)


def dead_in_broker(settings: Settings, queues: tuple[str, ...] = ("default", "bulk")) -> int:
    """Messages still in the broker's own dead-letter queues (``<queue>.XQ``), which the workers
    move into the dead-letter table: a message left there is one an operator would not see."""
    if settings.broker_is_rabbitmq:
        return sum(queue_depths(settings.broker_url, queue)[2] for queue in queues)
    if settings.broker_is_sqs:
        return sum(sqs_support.queue_depths(settings.broker_url, queue)[3] for queue in queues)
    client = redis.Redis.from_url(settings.broker_url)
    return sum(client.zcard(f"{settings.broker_namespace}:{queue}.XQ") for queue in queues)


def publish_raw(settings: Settings, queue: str, body: bytes, *, message_id: str | None = None) -> str:
    """Put ``body`` on ``queue`` as its bytes alone, as another producer (an older deploy, another
    service) would: past this process's broker object and its middleware. Returns the id the
    broker knows it by, which a dead letter of it is stored under.

    On Redis what Dramatiq's dispatch script writes: the body under ``message_id`` (a fresh one if
    not given) in the queue's hash, that id on the queue's list. On RabbitMQ a persistent publish,
    confirmed, with ``message_id`` as the AMQP message_id, to the queue as Dramatiq declares it.
    On SQS the bytes in base64, as dramatiq-sqs sends them; SQS draws the id.
    """
    if settings.broker_is_sqs:
        return sqs_support.send_raw(settings, queue, base64.b64encode(body).decode())
    if settings.broker_is_rabbitmq:
        broker = build_broker(settings)
        try:
            broker.declare_queue(queue, ensure=True)
            channel = broker.channel
            channel.confirm_delivery()
            properties = pika.BasicProperties(message_id=message_id, delivery_mode=2)
            channel.basic_publish("", queue, body, properties, mandatory=True)
        finally:
            broker.close()
        return str(message_id)
    key = f"{settings.broker_namespace}:{queue}"
    redis_id = message_id or str(uuid.uuid4())
    with redis.Redis.from_url(settings.broker_url).pipeline(transaction=True) as pipe:
        pipe.hset(f"{key}.msgs", redis_id, body)
        pipe.rpush(key, redis_id)
        pipe.execute()
    return redis_id


def publish_message(settings: Settings, message: dramatiq.Message[Any]) -> None:
    """:func:`publish_raw` of a message's bytes, with the id Dramatiq's Redis broker would draw."""
    if settings.broker_is_rabbitmq or settings.broker_is_sqs:
        publish_raw(settings, message.queue_name, message.encode())
        return
    redis_id = str(uuid.uuid4())  # as RedisBroker.enqueue draws it: the message id is not reused
    body = message.copy(options={**message.options, "redis_message_id": redis_id}).encode()
    publish_raw(settings, message.queue_name, body, message_id=redis_id)
