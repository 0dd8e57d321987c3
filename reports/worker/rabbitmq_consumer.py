"""The RabbitMQ consumer the workers run: it tells the fleet what it holds, and stores what it
rejects or cannot decode before acking it.

Why: docs/explanation/failures.md, "Poison messages are isolated", and
docs/explanation/architecture.md, "Inside a worker". This overrides the private consumer's
``__next__``; Dramatiq is pinned.
"""

from __future__ import annotations

import logging

from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import _RabbitmqConsumer, _RabbitmqMessage
from dramatiq.common import q_name
from dramatiq.errors import ConnectionClosed, DecodeError
from dramatiq.message import Message

from reports.worker import holding, rabbitmq, rejects
from reports.worker.queue_types import TypedRabbitmqBroker
from reports.worker.signals import DirectSignals

logger = logging.getLogger(__name__)

#: Set on each message to the consumer whose channel delivered it.
_RECEIVED_BY = "_reports_received_by"


class ReportsRabbitmqBroker(DirectSignals, holding.SharesHeld, TypedRabbitmqBroker):
    """Dramatiq's RabbitMQ broker with this module's consumer, declaring its queues as one type
    (``queue_type``, RABBITMQ_QUEUE_TYPE), and sharing what its workers hold
    (:class:`reports.worker.holding.SharesHeld`, whose parameters it takes)."""

    @property
    def consumer_class(self) -> type[_RabbitmqConsumer]:
        return Consumer


class Consumer(_RabbitmqConsumer):
    broker: ReportsRabbitmqBroker

    def __next__(self) -> MessageProxy | None:
        message = self._next()
        # Before the message goes to a worker thread, so a reader sees it held before it starts.
        self.broker.held_publisher.publish_if_due()
        return message

    def _next(self) -> MessageProxy | None:
        # Dramatiq's __next__, with the decode error and the held message handled here.
        try:
            method, properties, body = next(self.iterator)
            if method is None:
                return None
        except (AssertionError, *rabbitmq.AMQP_ERRORS) as e:
            if getattr(e, "reply_code", None) == 404:
                self.broker.queues_pending.add(q_name(self.queue_name))
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]
        try:
            decoded = Message.decode(body)
        except DecodeError:
            self._dead_letter(method.delivery_tag, rabbitmq.message_id_of(properties, body), body)
            return None
        message = _RabbitmqMessage(method.redelivered, method.delivery_tag, decoded)  # type: ignore[no-untyped-call]
        setattr(message, _RECEIVED_BY, self)
        self.known_tags.add(method.delivery_tag)
        holding.hold(self.broker.held, self, self.queue_name, message)
        return message

    def ack(self, message: MessageProxy) -> None:
        try:
            if self._received_here(message):
                super().ack(message)  # type: ignore[no-untyped-call]
        finally:
            holding.release(self.broker.held, message)

    def nack(self, message: MessageProxy) -> None:
        # Dramatiq's nack only schedules the reject on this consumer's connection, so a sweep of
        # .XQ right after it finds nothing, and the message would wait there for the next worker
        # boot. Stored here, it is acked instead; if it cannot be stored, it is rejected as before.
        try:
            if not self._received_here(message):
                return
            if self._store(message.message_id, message.encode()):
                super().ack(message)  # type: ignore[no-untyped-call]
            else:
                super().nack(message)  # type: ignore[no-untyped-call]
        finally:
            holding.release(self.broker.held, message)

    def _received_here(self, message: MessageProxy) -> bool:
        """Whether ``message`` came over this consumer's channel. Dramatiq's worker settles every
        message through its current consumer, and a new channel numbers its deliveries from 1
        again: a message received before a reconnect would ack, by its old tag, another message
        that has not run. RabbitMQ requeued it when its channel closed; it runs again."""
        if getattr(message, _RECEIVED_BY, self) is self:
            return True
        logger.info(
            "Message %s came over a channel since closed: RabbitMQ has requeued it, so it is not settled here.",
            message.message_id,
            extra={"message_id": message.message_id, "queue": self.queue_name},
        )
        return False

    def close(self) -> None:
        try:
            super().close()  # type: ignore[no-untyped-call]
        finally:
            self.broker.held.release_all(self)
            self.broker.held_publisher.publish_if_due(force=True)

    def _store(self, message_id: str, body: bytes) -> bool:
        return rejects.store(self.broker, self.queue_name, message_id, body)

    def _dead_letter(self, tag: int, message_id: str, body: bytes) -> None:
        stored = self._store(message_id, body)
        try:
            if stored:
                self.channel.basic_ack(tag)
            else:
                self.channel.basic_nack(tag, requeue=False)
        except rabbitmq.AMQP_ERRORS as e:
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]
        logger.error(
            "Undecodable message %s on %s moved to the dead letters.",
            message_id,
            self.queue_name,
            extra={"message_id": message_id, "queue": self.queue_name},
        )
