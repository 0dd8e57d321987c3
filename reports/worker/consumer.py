"""The Redis consumer the workers run: it acks and fetches in batches, and dead-letters what it cannot decode.

**Fetches in batches.** Dramatiq's consumer fetches (one script call) whenever fewer messages are
outstanding than its prefetch: under load every ack made room for one message, and the next
fetch brought that one. Here it fetches again only once :data:`REFILL_BELOW` of the prefetch is
left, so a fetch brings a quarter of the prefetch or more while the worker threads still have
the rest queued (the end-to-end benchmark's figures are in docs/benchmarks.md).

**Acks in batches.** Dramatiq acks each message with a call of its dispatch script: in a profile of
a worker running an actor that does nothing (bench/dramatiq_overhead.py, docs/benchmarks.md) that
round trip was a large share of Dramatiq's own CPU per message. Here an ack leaves the consumer's count of outstanding
messages at once (so prefetching goes on as before) and reaches Redis with the others of up to
:data:`ACK_DELAY_SECONDS`, in one script call that does what Dramatiq's ``ack`` does for each id.
A process killed before its batch is written leaves those messages in its ack set, so they run
again once its heartbeat times out, as any message in flight at a kill does: the delivery claim
makes that second run send nothing.

**Undecodable messages.** Dramatiq 2.2.1's Redis consumer decodes each fetched message in ``_RedisConsumer.__next__``. A
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
import threading
import time
from typing import Any, cast

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import ConnectionClosed, DecodeError

logger = logging.getLogger(__name__)

#: The middleware method called with ``(broker, queue_name, broker_message_id, body)``: here after
#: the move into ``.XQ``, on RabbitMQ before the ack (:mod:`reports.worker.rabbitmq_consumer`).
HOOK = "after_undecodable_message"

#: Longest an ack waits for others before it is written, in seconds.
ACK_DELAY_SECONDS = 0.1
#: Acks written at once at most: a batch this large is written without waiting.
ACK_BATCH = 100

#: Of the prefetch, the share still outstanding below which the consumer fetches again.
REFILL_BELOW = 0.75
#: How long the consumer waits before it looks again while enough is still outstanding, in seconds.
REFILL_PAUSE_SECONDS = 0.005

#: Dramatiq's ``ack`` for each id: the body is deleted only if this process still held the id,
#: since a message requeued from a process thought dead may now be another one's.
_ACK_ALL = """
for i = 1, #ARGV do
    if redis.call("srem", KEYS[1], ARGV[i]) > 0 then
        redis.call("hdel", KEYS[2], ARGV[i])
    end
end
"""


class _UnwrittenAcks:
    """One queue's acks not yet in Redis. Kept by the broker, not the consumer: Dramatiq drops a
    consumer whose connection failed and starts a new one, which must write them, or their ids
    would stay in this live process's ack set (never requeued, counted as in flight) for good."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[str] = []
        self.oldest = 0.0


class ReportsBroker(RedisBroker):
    """Dramatiq's Redis broker with this module's consumer."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)  # type: ignore[no-untyped-call]  # Dramatiq has no annotations
        self._unwritten_acks: dict[str, _UnwrittenAcks] = {}

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return Consumer

    def unwritten_acks(self, queue_name: str) -> _UnwrittenAcks:
        # Consumers of one queue follow each other (one consumer thread per queue).
        return self._unwritten_acks.setdefault(queue_name, _UnwrittenAcks())


class Consumer(_RedisConsumer):
    def __init__(self, broker: ReportsBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        # Worker threads ack; the consumer thread writes what waited too long.
        self._acks = broker.unwritten_acks(queue_name)
        self._ack_all = broker.client.register_script(_ACK_ALL)
        self._ack_keys = [
            f"{broker.namespace}:__acks__.{broker.broker_id}.{queue_name}",
            f"{broker.namespace}:{queue_name}.msgs",
        ]

    def ack(self, message: MessageProxy) -> None:
        acks = self._acks
        with acks.lock:
            if not acks.ids:
                acks.oldest = time.monotonic()
            acks.ids.append(message.options["redis_message_id"])
            self.queued_message_ids.discard(message.message_id)
            full = len(acks.ids) >= ACK_BATCH
        if full:
            self._write_acks()

    def _write_acks(self) -> None:
        acks = self._acks
        with acks.lock:
            written, acks.ids = acks.ids, []
        if not written:
            return
        try:
            self._ack_all(keys=self._ack_keys, args=written)
        except redis.ConnectionError as e:
            # Kept for the next write, by this consumer or the one Dramatiq starts after it.
            with acks.lock:
                acks.ids[:0] = written
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]  # Dramatiq has no annotations

    def close(self) -> None:
        try:
            self._write_acks()
        finally:
            super().close()

    def __next__(self) -> MessageProxy | None:
        # The consumer thread calls this between its other work, and before it idles.
        if self._acks.ids and time.monotonic() - self._acks.oldest >= ACK_DELAY_SECONDS:
            self._write_acks()
        if not self.message_cache and len(self.queued_message_ids) > self.prefetch * REFILL_BELOW:
            # Dramatiq fetches as soon as one message is acked, so under load each fetch (a script
            # call) brought the one message a finished thread made room for. Waiting until a
            # quarter of the prefetch is spent makes it bring a batch, while the threads still
            # have the rest queued.
            time.sleep(REFILL_PAUSE_SECONDS)
            return None
        while True:
            try:
                # Dramatiq's _RedisConsumer.__next__ has no annotations.
                message = cast(MessageProxy | None, super().__next__())  # type: ignore[no-untyped-call]
            except DecodeError as error:
                # The rest of the prefetched batch is still in the cache: the next turn takes it.
                self._dead_letter(error.data)
                continue
            if message is None and self._acks.ids:
                self._write_acks()  # nothing to fetch: the queue is idle, write what waits
            return message

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
                hook(self.broker, self.queue_name, redis_id, data)

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
