"""A message in a Redis queue that cannot be decoded becomes a dead letter; the consumer goes on.

Dramatiq 2.2.1's Redis consumer decodes each fetched message in ``_RedisConsumer.__next__``. A
``DecodeError`` there (bytes that are not UTF-8, text that is not JSON, JSON that is not a
message) escapes to the worker's consumer thread, which logs it as critical, drops the consumer
with the other messages it had prefetched and starts a new one after 3 s. The bad message and
the dropped ones stay in the process's ack set, so they come back only when the worker process
dies, and the bad one then stops the next consumer the same way.

Here the consumer moves such a message to the queue's dead-letter keys with the broker's own
``nack`` (one atomic script: out of the queue's hash and the ack set, into ``.XQ``) and carries
on with the next message. Middleware with an ``after_undecodable_message`` hook is then told, so
that :class:`reports.worker.dead_letter_sink.BrokerDeadLetters` stores it at once. This leans on the
broker's private consumer class and key layout; Dramatiq is pinned.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import DecodeError

logger = logging.getLogger(__name__)

#: The middleware method called with ``(broker, queue_name, redis_message_id)`` after the move.
HOOK = "after_undecodable_message"


class UndecodableAsDeadLetters(RedisBroker):
    """A Redis broker whose consumers dead-letter messages they cannot decode."""

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _Consumer


class _Consumer(_RedisConsumer):
    def __next__(self) -> MessageProxy | None:
        while True:
            try:
                # Dramatiq's _RedisConsumer.__next__ has no annotations.
                return cast(MessageProxy | None, super().__next__())  # type: ignore[no-untyped-call]
            except DecodeError as error:
                # The rest of the prefetched batch is still in the cache: the next turn takes it.
                self._dead_letter(error.data)

    def _dead_letter(self, data: bytes) -> None:
        redis_id = self._fetched_id_of(data)
        if redis_id is None:
            logger.error("An undecodable message on %s vanished before it could be dead-lettered.", self.queue_name)
            return
        self.broker.do_nack(self.queue_name, redis_id)
        logger.error(
            "Undecodable message %s on %s moved to the dead letters.",
            redis_id,
            self.queue_name,
            extra={"message_id": redis_id, "queue": self.queue_name},
        )
        for middleware in self.broker.middleware:
            hook = getattr(middleware, HOOK, None)
            if hook is not None:
                hook(self.broker, self.queue_name, redis_id)

    def _fetched_id_of(self, data: bytes) -> str | None:
        """The id this process fetched ``data`` under: the fetch script returns bodies, not ids.

        The ack set holds only what this process fetched from this queue and has not acked (a
        prefetch's worth), so comparing bodies is cheap. Two identical bodies are
        interchangeable: the other one is found when it comes up.
        """
        client: Any = self.broker.client
        namespace, queue = self.broker.namespace, self.queue_name
        ids = sorted(client.smembers(f"{namespace}:__acks__.{self.broker.broker_id}.{queue}"))
        if not ids:
            return None
        bodies = client.hmget(f"{namespace}:{queue}.msgs", ids)
        return next((i.decode() for i, body in zip(ids, bodies, strict=True) if body == data), None)
