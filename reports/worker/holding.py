"""The consumers' side of :mod:`reports.worker.held`: each message a consumer hands out is held
until it is settled, on either broker.

A broker that holds messages has a ``held`` (:class:`reports.worker.held.HeldMessages`) and the
middleware :class:`StartedMessages` (:class:`SharesHeld` gives them to the RabbitMQ and SQS
brokers); its consumers call :func:`hold` when they hand a message out and :func:`release` when
it is acked, nacked or requeued.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, cast

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware

from reports.worker.held import DELAY_SUFFIX, HeldMessages, Publisher

#: The attribute of a handed-out message that holds its :class:`reports.worker.held.Held`.
_HELD = "_reports_held"


def ready_since_ms(message_timestamp_ms: int, options: Mapping[str, Any]) -> int:
    """When a message became ready to run, in Unix ms: when it was enqueued or, for one that waited
    out a delay (a retry's backoff, a deferral), when that came due (Dramatiq's ``eta``). A copy
    keeps the first enqueue's timestamp through every retry and deferral: counted from there, a
    message deferred for a quarter of an hour would look a quarter of an hour old the moment it
    was ready again."""
    eta = options.get("eta")
    return max(message_timestamp_ms, int(eta)) if isinstance(eta, int | float) else message_timestamp_ms


def hold(held: HeldMessages, owner: object, queue: str, message: MessageProxy) -> None:
    """Record that ``owner`` handed ``message`` out from ``queue``; a message held already stays as it is.

    A delay queue's messages are only held until due: they do not count as waiting.
    """
    if getattr(message, _HELD, None) is None:
        timestamp_ms = ready_since_ms(int(message.message_timestamp), message.options)
        setattr(message, _HELD, held.hold(owner, queue, timestamp_ms, waiting=not queue.endswith(DELAY_SUFFIX)))


def release(held: HeldMessages, message: MessageProxy) -> None:
    """The message is settled; releasing it twice, or one never held, is harmless."""
    entry = getattr(message, _HELD, None)
    if entry is not None:
        held.release(entry)


class StartedMessages(Middleware):
    """Marks a held message as no longer waiting once a worker thread takes it."""

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        entry = getattr(message, _HELD, None)
        held: Any = getattr(broker, "held", None)
        if entry is not None and isinstance(held, HeldMessages):
            held.start(entry)


class SharesHeld:
    """A broker mix-in: its workers publish what their consumers hold to the shared Redis, for a
    broker whose own counts leave it out (RabbitMQ) or cannot tell a live worker's from a dead
    one's (SQS).

    :param shared_redis: the Redis of the fleet's shared state (REDIS_URL), where the snapshots go.
    :param namespace: the key namespace there (BROKER_NAMESPACE).
    """

    def __init__(self, *, shared_redis: redis.Redis, namespace: str, **options: Any) -> None:
        super().__init__(**options)
        self.shared_redis = shared_redis
        self.namespace = namespace
        self.held = HeldMessages()
        self.held_publisher = Publisher(self.held, shared_redis, namespace=namespace, process=str(uuid.uuid4()))
        cast(dramatiq.Broker, self).add_middleware(StartedMessages())
