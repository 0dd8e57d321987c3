"""The Redis consumer the workers run: it acks and fetches in batches, hands what it holds to the
consumer after it, publishes what it holds, and dead-letters what it cannot decode.

Why each (Dramatiq's own consumer at scale): docs/explanation/architecture.md, "Inside a worker",
and docs/explanation/failures.md, "Poison messages are isolated". It leans on the broker's private
consumer class and key layout; Dramatiq is pinned.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any, cast

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import ConnectionClosed, DecodeError

from reports.worker import held, holding, redis_clock
from reports.worker.signals import DirectSignals

logger = logging.getLogger(__name__)

#: The middleware method called with ``(broker, queue_name, broker_message_id, body)``: here after
#: the move into ``.XQ``, on RabbitMQ before the ack (:mod:`reports.worker.rabbitmq_consumer`).
HOOK = "after_undecodable_message"

#: Longest an ack waits for others before it is written, in seconds.
ACK_DELAY_SECONDS = 0.1
#: Acks written at once at most: a batch this large is written without waiting.
ACK_BATCH = 100
#: First and longest pause before a batch of acks Redis could not take is tried again, in seconds.
ACK_RETRY_PAUSE_SECONDS = 0.1
ACK_RETRY_PAUSE_CAP_SECONDS = 2.0

#: Of the prefetch, the share still outstanding below which the consumer fetches again.
REFILL_BELOW = 0.75
#: Longest the consumer waits for an ack to make room while enough is still outstanding, in
#: seconds: it then looks at what else is due (a delayed message, what it holds to publish).
REFILL_WAIT_SECONDS = 0.1

#: What a Redis call raises when Redis cannot be reached (or answered too late).
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)

#: Dramatiq's ``ack`` for each id: the body is deleted only if this process still held the id,
#: since a message requeued from a process thought dead may now be another one's.
_ACK_ALL = """
for i = 1, #ARGV do
    if redis.call("srem", KEYS[1], ARGV[i]) > 0 then
        redis.call("hdel", KEYS[2], ARGV[i])
    end
end
"""


class _Handover:
    """What one consumer of a queue leaves to the next (see the module): kept by the broker, since
    Dramatiq drops a consumer whose connection failed and starts a new one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: Acks not yet written, the monotonic time the oldest was made, and when to try again.
        self.ack_ids: list[str] = []
        self.oldest = 0.0
        self.retry_at = 0.0
        self.pause = ACK_RETRY_PAUSE_SECONDS
        self.failing = False
        #: Fetched and not handed out, as Redis returned them.
        self.bodies: list[bytes] = []
        #: Handed out by a delay queue's consumer and not settled: still held.
        self.delayed: list[MessageProxy] = []


class ReportsBroker(DirectSignals, RedisBroker):
    """Dramatiq's Redis broker with this module's consumer, publishing what its consumers hold, its
    heartbeats on Redis's clock."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # Every broker call goes through this script: the heartbeat it writes and the dead-worker
        # sweep it runs then read Redis's clock, not this process's (reports.worker.redis_clock).
        dispatch = cast(bytes, self.scripts["dispatch"].script).decode()  # Dramatiq registers the file's bytes
        self.scripts["dispatch"] = self.client.register_script(redis_clock.on_server_clock(dispatch))
        self._handovers: dict[str, _Handover] = {}
        self.held = held.HeldMessages()
        # Outlives the heartbeat: a process killed with -9 counts as holding its messages until
        # its heartbeat is stale, when backlog counts its ack sets instead.
        ttl_seconds = math.ceil(self.heartbeat_timeout / 1000 + held.PUBLISH_INTERVAL_SECONDS)
        self.held_publisher = held.Publisher(
            self.held, self.client, namespace=self.namespace, process=self.broker_id, ttl_seconds=ttl_seconds
        )
        self.add_middleware(holding.StartedMessages())

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return Consumer

    def handover(self, queue_name: str) -> _Handover:
        # Consumers of one queue follow each other (one consumer thread per queue).
        return self._handovers.setdefault(queue_name, _Handover())


class Consumer(_RedisConsumer):
    def __init__(self, broker: ReportsBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        # Worker threads ack; the consumer thread writes what waited too long.
        self._handover = handover = broker.handover(queue_name)
        with handover.lock:
            self.message_cache, handover.bodies = handover.bodies, []
            self._handed_back, handover.delayed = handover.delayed, []
        self._on_delay_queue = queue_name.endswith(held.DELAY_SUFFIX)
        #: Outstanding messages at or below which the consumer fetches again.
        self._refill_at = prefetch * REFILL_BELOW
        #: Set when an ack or a nack made room to fetch, or started a batch of acks to write.
        self._woken = threading.Event()
        #: A delay queue's messages handed out and not yet settled, by Redis id.
        self._delayed: dict[str, MessageProxy] = {}
        self._ack_all = broker.client.register_script(_ACK_ALL)
        self._ack_keys = [
            f"{broker.namespace}:__acks__.{broker.broker_id}.{queue_name}",
            f"{broker.namespace}:{queue_name}.msgs",
        ]

    def ack(self, message: MessageProxy) -> None:
        acks = self._handover
        with acks.lock:
            if not acks.ack_ids:
                acks.oldest = time.monotonic()
            acks.ack_ids.append(message.options["redis_message_id"])
            self.queued_message_ids.discard(message.message_id)
            first = len(acks.ack_ids) == 1
            full = len(acks.ack_ids) >= ACK_BATCH and time.monotonic() >= acks.retry_at
        self._settle(message)
        if first or len(self.queued_message_ids) <= self._refill_at:
            # The consumer waits for this (_next): room to fetch, or a batch whose deadline it must keep.
            self._woken.set()
        if full:
            self._write_acks()

    def nack(self, message: MessageProxy) -> None:
        super().nack(message)  # type: ignore[no-untyped-call]
        # Only once it is in .XQ: Dramatiq tries a nack that raised again, on this thread.
        self._settle(message)
        self._woken.set()

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        messages = list(messages)
        try:
            super().requeue(messages)  # type: ignore[no-untyped-call]
        except _UNREACHABLE as error:
            # Still in this process's ack set and still held: a delay queue's go to the next
            # consumer with close(); others (a stopping worker's) run again once the process is gone.
            logger.warning(
                "Could not requeue %d message(s) of %s (%s).", len(messages), self.queue_name, type(error).__name__
            )
            return
        for message in messages:
            self._settle(message)

    def close(self) -> None:
        try:
            self._write_acks()
        finally:
            handover = self._handover
            with handover.lock:
                handover.bodies[:0] = self.message_cache
                # Those it handed out and those it was still handing back from the consumer before
                # it: dropped in turn, it passes on both, or the second lot stays in this process's
                # ack set, held, until the process ends.
                handover.delayed[:0] = [*self._delayed.values(), *self._handed_back]
            self.message_cache, self._delayed, self._handed_back = [], {}, []
            self.broker.held_publisher.publish_if_due(force=True)
            super().close()

    def __next__(self) -> MessageProxy | None:
        message = self._next()
        if message is not None:
            self._hand_out(message)
        self.broker.held_publisher.publish_if_due()
        return message

    def _next(self) -> MessageProxy | None:
        # The consumer thread calls this between its other work, and before it idles.
        if self._handed_back:
            handed_back = self._handed_back.pop(0)
            self.queued_message_ids.add(handed_back.message_id)
            return handed_back
        acks = self._handover
        now = time.monotonic()
        if acks.ack_ids and now - acks.oldest >= ACK_DELAY_SECONDS and now >= acks.retry_at:
            self._write_acks()
        if not self.message_cache and len(self.queued_message_ids) > self._refill_at:
            # Dramatiq fetches as soon as one message is acked, so under load each fetch (a script
            # call) brought the one message a finished thread made room for. Waiting until a
            # quarter of the prefetch is spent makes it bring a batch, while the threads still
            # have the rest queued. It waits on the acks rather than polling: a thread that woke
            # every few milliseconds cost the worker threads the GIL as often.
            self._woken.clear()
            if len(self.queued_message_ids) > self._refill_at:  # an ack may have come before the clear
                self._woken.wait(self._wait_seconds(now))
            return None
        while True:
            try:
                # Dramatiq's _RedisConsumer.__next__ has no annotations.
                message = cast(MessageProxy | None, super().__next__())  # type: ignore[no-untyped-call]
            except DecodeError as error:
                # The rest of the prefetched batch is still in the cache: the next turn takes it.
                self._dead_letter(error.data)
                continue
            if message is None and acks.ack_ids and time.monotonic() >= acks.retry_at:
                self._write_acks()  # nothing to fetch: the queue is idle, write what waits
            return message

    def _wait_seconds(self, now: float) -> float:
        """How long the consumer may wait for room: until the acks waiting are due, at most
        :data:`REFILL_WAIT_SECONDS`."""
        acks = self._handover
        if not acks.ack_ids:
            return REFILL_WAIT_SECONDS
        due = max(acks.oldest + ACK_DELAY_SECONDS, acks.retry_at)
        return min(max(due - now, 0.0), REFILL_WAIT_SECONDS)

    def _hand_out(self, message: MessageProxy) -> None:
        if self._on_delay_queue:
            self._delayed[message.options["redis_message_id"]] = message
        holding.hold(self.broker.held, self, self.queue_name, message)

    def _settle(self, message: MessageProxy) -> None:
        self._delayed.pop(message.options["redis_message_id"], None)
        holding.release(self.broker.held, message)

    def _write_acks(self) -> None:
        """Write the acks waiting; if Redis cannot take them, keep them for a later turn."""
        acks = self._handover
        with acks.lock:
            written, acks.ack_ids = acks.ack_ids, []
        if not written:
            return
        try:
            self._ack_all(keys=self._ack_keys, args=written)
        except _UNREACHABLE as error:
            with acks.lock:
                acks.ack_ids[:0] = written
                acks.retry_at = time.monotonic() + acks.pause
                acks.pause = min(acks.pause * 2, ACK_RETRY_PAUSE_CAP_SECONDS)
                first, acks.failing = not acks.failing, True
            if first:
                logger.warning(
                    "Could not write acks of %s (%s); keeping them and trying again.",
                    self.queue_name,
                    type(error).__name__,
                )
            return
        if acks.failing:
            with acks.lock:
                acks.failing, acks.pause, acks.retry_at = False, ACK_RETRY_PAUSE_SECONDS, 0.0
            logger.info("Acks of %s written again.", self.queue_name)

    def _dead_letter(self, data: bytes) -> None:
        try:
            redis_id = self._fetched_id_of(data)
            if redis_id is not None:
                self.broker.do_nack(self.queue_name, redis_id)
        except _UNREACHABLE as error:
            # Back at the head of the cache, which the next consumer takes over.
            self.message_cache.insert(0, data)
            raise ConnectionClosed(error) from None  # type: ignore[no-untyped-call]  # Dramatiq has no annotations
        if redis_id is None:
            logger.error("An undecodable message on %s vanished before it could be dead-lettered.", self.queue_name)
            return
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
