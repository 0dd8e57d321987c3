"""The RabbitMQ side of the broker: the bulk enqueue with batched publisher confirms, the queues'
depths, and reading the broker's own dead-letter queues.

Dramatiq's RabbitMQ broker names a queue's companions ``<queue>.DQ`` (delayed: retries and
deferrals, held by a worker until due) and ``<queue>.XQ`` (dead letters, by the queue's
dead-letter exchange). Unacked messages return to their queue when a worker's connection drops:
RabbitMQ needs no heartbeat sweep of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import dramatiq
import pika
import pika.exceptions
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import xq_name
from dramatiq.errors import ConnectionClosed

from reports.worker.queue_types import TypedRabbitmqBroker

#: Longest wait for RabbitMQ to confirm a batch of published messages, in seconds.
CONFIRM_TIMEOUT_SECONDS = 30.0

#: Dead letters read from one ``.XQ`` queue per sweep at most.
DEAD_LETTERS_PER_SWEEP = 500

#: What RabbitMQ could not take: a transient failure (the caller tries again), not a bad message.
AMQP_ERRORS = (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError)


class NotConfirmed(ConnectionClosed):
    """RabbitMQ refused (nacked or returned) messages of a batch, or did not confirm it in time."""

    def __init__(self, reason: str) -> None:
        super().__init__(RuntimeError(reason))  # type: ignore[no-untyped-call]


def _closed(error: Exception) -> ConnectionClosed:
    """Dramatiq's error for a broker that cannot be reached, which the callers' retries expect."""
    return ConnectionClosed(error)  # type: ignore[no-untyped-call]


class _Confirms:
    """Delivery tags a confirm-mode channel has published and RabbitMQ has not yet settled."""

    def __init__(self, published: int) -> None:
        self.outstanding = set(range(1, published + 1))
        self.refused = 0

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = {t for t in self.outstanding if t <= method.delivery_tag} if method.multiple else {method.delivery_tag}
        self.outstanding -= tags
        if isinstance(method, pika.spec.Basic.Nack):
            self.refused += len(tags)

    def on_return(self, *_args: Any) -> None:
        # A returned (unroutable) message is acked afterwards all the same: count it here.
        self.refused += 1


def publish_confirmed(broker: RabbitmqBroker, queue: str, messages: Sequence[dramatiq.Message[Any]]) -> int:
    """Publish ``messages`` to ``queue`` persistently and wait until RabbitMQ confirms them all.

    Dramatiq's ``confirm_delivery`` waits for each message's confirm before publishing the next:
    a round trip per message. Here the whole batch is published on a confirm-mode channel of its
    own and the confirms are awaited once. A connection found closed (an idle thread's, which
    RabbitMQ dropped for missed heartbeats) is opened again and the batch published once more;
    after that, or if RabbitMQ refused any message, raises a ``ConnectionClosed``. Publishing a
    batch again may enqueue some messages twice, which the delivery claims make harmless.
    Leans on pika's asynchronous channel under the blocking one; pika is pinned.
    """
    if not messages:
        return 0
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            _publish_batch(broker, queue, messages)
            break
        except AMQP_ERRORS as error:
            del broker.connection
            if attempt + 1 == PUBLISH_ATTEMPTS:
                raise _closed(error) from None
    for message in messages:
        broker.emit_after("enqueue", message, None)
    return len(messages)


#: Tries at publishing one batch: the second on a connection opened afresh.
PUBLISH_ATTEMPTS = 2


def _publish_batch(broker: RabbitmqBroker, queue: str, messages: Sequence[dramatiq.Message[Any]]) -> None:
    broker.declare_queue(queue, ensure=True)
    connection = broker.connection
    channel = connection.channel()
    confirms = _Confirms(len(messages))
    try:
        selected: list[bool] = []
        impl = channel._impl
        impl.confirm_delivery(ack_nack_callback=confirms.on_confirm, callback=lambda _frame: selected.append(True))
        impl.add_on_return_callback(confirms.on_return)
        _wait(connection, lambda: bool(selected))
        properties = pika.BasicProperties(delivery_mode=2)
        for message in messages:
            broker.emit_before("enqueue", message, None)
            impl.basic_publish(
                exchange="", routing_key=queue, body=message.encode(), properties=properties, mandatory=True
            )
        _wait(connection, lambda: not confirms.outstanding)
    finally:
        if channel.is_open:
            channel.close()
    if confirms.refused:
        raise NotConfirmed(f"RabbitMQ refused {confirms.refused} of {len(messages)} message(s).")


def _wait(connection: pika.BlockingConnection, done: Callable[[], bool]) -> None:
    """Do the connection's I/O until ``done()``. ``process_data_events`` would not return early:
    it wakes for callbacks of the blocking layer only, and these are the asynchronous channel's."""
    timed_out: list[bool] = []
    # On the I/O loop itself: the blocking connection's own timers fire only in process_data_events.
    ioloop = connection._impl.ioloop
    timer = ioloop.call_later(CONFIRM_TIMEOUT_SECONDS, lambda: timed_out.append(True))
    try:
        connection._flush_output(lambda: done() or bool(timed_out))
    finally:
        ioloop.remove_timeout(timer)
    if not done():
        raise NotConfirmed(f"RabbitMQ did not confirm within {CONFIRM_TIMEOUT_SECONDS:.0f}s.")


def ready_counts(broker: RabbitmqBroker, queue: str) -> tuple[int, int, int]:
    """Messages ready in ``queue``, its ``.DQ`` and its ``.XQ``, as RabbitMQ counts them.

    RabbitMQ counts only what no consumer holds: messages a worker prefetched, and delayed
    messages it holds until they are due, are not in these figures. Dramatiq counts by declaring
    the three queues, so they are declared first as the broker declares them (once per broker).
    """
    try:
        broker.declare_queue(queue, ensure=True)
        ready, delayed, dead = broker.get_queue_message_counts(queue)
    except AMQP_ERRORS as error:
        del broker.connection
        raise _closed(error) from None
    return ready, delayed, dead


def ready_counts_at(url: str, queues: Sequence[str], *, queue_type: str) -> dict[str, tuple[int, int, int]]:
    """:func:`ready_counts` of each queue, on a connection of its own that is closed afterwards:
    for a process that reads the depths from threads that come and go (the exporter).

    :param queue_type: the type the queues are declared with if missing (RABBITMQ_QUEUE_TYPE).
    """
    broker = TypedRabbitmqBroker(url=url, queue_type=queue_type, middleware=[])
    try:
        return {queue: ready_counts(broker, queue) for queue in queues}
    finally:
        broker.close()


def take_dead_letters(broker: RabbitmqBroker, queue: str, handle: Callable[[bytes, str], None]) -> int:
    """Hand each message of ``queue``'s ``.XQ`` to ``handle(body, message_id)``; returns how many.

    A message leaves the broker only once ``handle`` returned; if it raises, the message goes
    back to the head of ``.XQ`` and the sweep stops there (the next one tries again).
    """
    broker.declare_queue(queue, ensure=True)
    channel = broker.channel
    taken = 0
    while taken < DEAD_LETTERS_PER_SWEEP:
        method, properties, body = channel.basic_get(xq_name(queue), auto_ack=False)
        if method is None:
            break
        try:
            handle(body, message_id_of(properties, body))
        except Exception:
            channel.basic_nack(method.delivery_tag, requeue=True)
            raise
        channel.basic_ack(method.delivery_tag)
        taken += 1
    return taken


def message_id_of(properties: Any, body: bytes) -> str:
    """The id a raw message is stored under: its AMQP ``message_id``, else one drawn from its bytes.

    Dramatiq publishes no ``message_id`` property. Drawn from the bytes, the id is the same each
    time the message is redelivered, so the dead-letter store keeps one row of it (a delivery tag,
    used before, starts over on every channel). Two messages of identical bytes are one row.
    """
    return properties.message_id or f"rabbitmq-{hashlib.sha256(body).hexdigest()[:24]}"
