"""The Dramatiq broker, built in one place from the settings for workers and producers alike."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeGuard, Union

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, TimeLimit

from reports.endpoints import SqsTarget
from reports.jobs import ActorSpec
from reports.settings import ACTOR_TIME_LIMIT_MS, Settings
from reports.worker.consumer import ReportsBroker
from reports.worker.rabbitmq_consumer import ReportsRabbitmqBroker

if TYPE_CHECKING:
    from reports.worker.sqs_consumer import ReportsSqsBroker

logger = logging.getLogger(__name__)

#: The broker as the library passes it around: only this package imports Dramatiq.
Broker = Union[RedisBroker, ReportsRabbitmqBroker, "ReportsSqsBroker"]  # noqa: UP007 - a name imported only for mypy

#: Message option naming the coordinator chain a ``plan_period`` message belongs to.
WALKER_OPTION = "walker"

#: Longest pause between tries at an enqueue that must not be dropped, in seconds.
ENQUEUE_RETRY_PAUSE_CAP_SECONDS = 2.0


def build_broker(settings: Settings) -> Broker:
    """The broker BROKER_URL names: Redis, RabbitMQ or Amazon SQS.

    On Redis every process, producers included, must use the same heartbeat settings: the sweep
    that requeues a dead worker's messages runs inside whichever process's broker call wins the
    ``maintenance_chance`` draw. RabbitMQ returns a dead worker's unacked messages itself, when
    its connection drops, SQS when their visibility timeout runs out; these brokers carry the
    shared Redis (REDIS_URL), where their workers publish what they hold (:mod:`reports.worker.held`).
    """
    # Of Dramatiq's defaults only the time limit: no actor uses max_age, callbacks, pipelines or
    # shutdown notifications, and every middleware is called at each of a message's signals.
    # Retries are reports.worker.retries.JitteredRetries, added by the workers (it needs the
    # dead-letter store).
    middleware = [TimeLimit(time_limit=ACTOR_TIME_LIMIT_MS), CurrentMessage()]
    if settings.broker_is_rabbitmq:
        # Confirms on every enqueue: a retry's or a deferral's copy is enqueued before its original
        # is acked, so a copy RabbitMQ never took would be a lost message.
        return ReportsRabbitmqBroker(
            url=settings.broker_url,
            confirm_delivery=True,
            middleware=middleware,
            shared_redis=redis.Redis.from_url(settings.shared_redis_url),
            namespace=settings.broker_namespace,
            queue_type=settings.rabbitmq_queue_type,
        )
    if settings.broker_is_sqs:
        # Imported here, not at the top: boto3 under it is a sixth of what a process imports.
        from reports.worker.sqs_consumer import ReportsSqsBroker

        return ReportsSqsBroker(
            target=SqsTarget.from_url(settings.broker_url),
            visibility_timeout=settings.sqs_visibility_timeout_seconds,
            max_receive_count=settings.sqs_max_receive_count,
            middleware=middleware,
            shared_redis=redis.Redis.from_url(settings.shared_redis_url),
            namespace=settings.broker_namespace,
        )
    return ReportsBroker(
        url=settings.broker_url,
        namespace=settings.broker_namespace,
        heartbeat_timeout=settings.heartbeat_timeout_ms,
        maintenance_chance=settings.maintenance_chance,
        middleware=middleware,
    )


def is_sqs(broker: object) -> TypeGuard[ReportsSqsBroker]:
    """Whether ``broker`` is the SQS broker, without importing it: a process whose BROKER_URL does
    not name SQS never imports its module, and then holds no SQS broker."""
    consumer = sys.modules.get("reports.worker.sqs_consumer")
    return consumer is not None and isinstance(broker, consumer.ReportsSqsBroker)


def declare_queues(broker: Broker, queues: Iterable[str]) -> None:
    """Declare ``queues``, each with its ``.DQ`` and ``.XQ``, on RabbitMQ (nothing on Redis or SQS).

    For a process to meet a queue of another type than RABBITMQ_QUEUE_TYPE at start, where it stops
    in one line (:class:`reports.worker.queue_types.QueueMismatch`), rather than at its first
    enqueue, or in every consumer thread of a worker, which would log it and try again for ever.
    A RabbitMQ that cannot be reached now is left to the first use, which declares the same way.
    """
    if not isinstance(broker, ReportsRabbitmqBroker):
        return
    queues = list(queues)
    try:
        # Every queue checked before any is declared: a mismatch leaves RabbitMQ as it was.
        broker.check(queues)
        for queue in queues:
            broker.declare_queue(queue, ensure=True)
    except dramatiq.errors.BrokerConnectionError as error:
        logger.warning("Could not declare the queues at start (%s); the first use will.", type(error).__name__)
    finally:
        # This thread's connection, which would otherwise idle until RabbitMQ drops it.
        del broker.connection


#: What a broker that cannot be reached raises: Redis's errors, and Dramatiq's for RabbitMQ (through
#: pika) and SQS (translated).
BROKER_OUTAGES = (redis.ConnectionError, redis.TimeoutError, dramatiq.errors.BrokerConnectionError)


def shared_redis(broker: Broker, settings: Settings) -> redis.Redis:
    """The Redis of the fleet's shared state (REDIS_URL): the broker's own client when it is that
    Redis, or the one the RabbitMQ or SQS broker was built with."""
    if isinstance(broker, RedisBroker) and settings.shared_redis_url == settings.broker_url:
        return broker.client
    if isinstance(broker, ReportsRabbitmqBroker) or is_sqs(broker):
        return broker.shared_redis
    return redis.Redis.from_url(settings.shared_redis_url)


def message_for(
    spec: ActorSpec, payload: Mapping[str, Any], *, options: dict[str, Any] | None = None
) -> dramatiq.Message[Any]:
    """A message for ``spec``'s actor, built without importing the actors (producers need only names)."""
    return dramatiq.Message(
        queue_name=spec.queue, actor_name=spec.name, args=spec.arguments(payload), kwargs={}, options=options or {}
    )


def send(
    broker: dramatiq.Broker,
    spec: ActorSpec,
    payload: Mapping[str, Any],
    *,
    delay_ms: int | None = None,
    options: dict[str, Any] | None = None,
) -> None:
    broker.enqueue(message_for(spec, payload, options=options), delay=delay_ms)


def enqueue_until_sent(
    broker: dramatiq.Broker,
    message: dramatiq.Message[Any],
    *,
    delay_ms: int | None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Enqueue ``message``, trying again for as long as the broker cannot be reached.

    For the copy a worker enqueues of the message it is processing (a retry, a deferral): the
    original is acked once this returns, so giving up here would lose the message. While Redis
    is failing over the thread waits; if the process is stopped meanwhile, the original stays
    unacked and comes back through the dead-worker sweep.
    """
    pause = 0.05
    while True:
        try:
            broker.enqueue(message, delay=delay_ms)
            return
        except BROKER_OUTAGES as error:
            logger.warning(
                "Could not enqueue message %s (%s); trying again in %.2fs.",
                message.message_id,
                type(error).__name__,
                pause,
            )
            sleep(pause)
            pause = min(pause * 2, ENQUEUE_RETRY_PAUSE_CAP_SECONDS)


def attempt_time(epoch_ms: float) -> str:
    """An attempt's time as a log line gives it: ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


def defer_current(broker: dramatiq.Broker, *, delay_ms: int, reason: str) -> None:
    """Run the message being processed again after ``delay_ms``, without spending a retry, and
    say so in one line (``reason``: why, with ids only)."""
    message = CurrentMessage.get_current_message()
    if message is None:
        raise RuntimeError("defer_current needs the CurrentMessage middleware and a running message.")
    enqueue_until_sent(broker, message.copy(), delay_ms=delay_ms)
    logger.info(
        "Deferred message %s (%s) to %s: %s",
        message.message_id,
        message.actor_name,
        attempt_time(time.time() * 1000 + delay_ms),
        reason,
        extra={"message_id": message.message_id, "actor": message.actor_name},
    )
