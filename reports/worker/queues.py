"""The queue port (:class:`reports.queue.Queue`) on each broker: Redis, RabbitMQ and SQS."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from redis.typing import EncodableT, FieldT

from reports.jobs import COORDINATOR, ActorSpec
from reports.queue import Queue
from reports.worker import held, rabbitmq, redis_clock
from reports.worker.broker import WALKER_OPTION, Broker, is_sqs, message_for, send
from reports.worker.rabbitmq_consumer import ReportsRabbitmqBroker

if TYPE_CHECKING:
    from reports.worker.sqs_consumer import ReportsSqsBroker

#: Messages per round trip in :meth:`send_jobs`.
ENQUEUE_CHUNK = 1000


def queue_for(broker: Broker) -> Queue:
    """The queue port on ``broker``, chosen once for its kind."""
    if isinstance(broker, ReportsRabbitmqBroker):
        return RabbitmqQueue(broker)
    if is_sqs(broker):
        return SqsQueue(broker)
    return RedisQueue(broker)


class _BrokerQueue(ABC):
    """What the brokers do alike: single messages go through Dramatiq's own ``enqueue``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def send_coordinator(self, walker: str, payload: Mapping[str, Any], *, delay_ms: int | None = None) -> None:
        send(self.broker, COORDINATOR, payload, delay_ms=delay_ms, options={WALKER_OPTION: walker})

    def enqueue_again(
        self, *, queue: str, actor: str, args: list[Any], kwargs: dict[str, Any], walker: str | None = None
    ) -> str:
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=queue,
            actor_name=actor,
            args=tuple(args),
            kwargs=kwargs,
            options={WALKER_OPTION: walker} if walker else {},
        )
        self.broker.enqueue(message)
        return message.message_id

    def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
        """A chunk of messages per round trip: Dramatiq's ``actor.send`` costs one per message."""
        sent = 0
        chunk: list[dramatiq.Message[Any]] = []
        for payload in payloads:
            chunk.append(message_for(spec, payload, options=self._first_options()))
            if len(chunk) == ENQUEUE_CHUNK:
                sent += self._enqueue_chunk(spec.queue, chunk)
                chunk = []
        if chunk:
            sent += self._enqueue_chunk(spec.queue, chunk)
        return sent

    def _first_options(self) -> dict[str, Any] | None:
        return None

    @abstractmethod
    def _enqueue_chunk(self, queue: str, messages: list[dramatiq.Message[Any]]) -> int:
        """Enqueue ``messages`` on ``queue`` as this broker does it in bulk; how many went."""


class RedisQueue(_BrokerQueue):
    broker: RedisBroker

    def _first_options(self) -> dict[str, Any]:
        # The first enqueue of a message: the id RedisBroker.enqueue would draw, drawn here.
        return {"redis_message_id": str(uuid.uuid4())}

    def _enqueue_chunk(self, queue: str, messages: list[dramatiq.Message[Any]]) -> int:
        """One MULTI: exactly what the broker's ``dispatch`` script writes for each message (its
        body in the queue's hash, its id on the queue's list), as one HSET and one RPUSH. It leans
        on the broker's key layout, and Dramatiq is pinned."""
        broker = self.broker
        encoded: dict[FieldT, EncodableT] = {}
        for message in messages:
            broker.emit_before("enqueue", message, None)
            encoded[message.options["redis_message_id"]] = message.encode()
        with broker.client.pipeline(transaction=True) as pipe:
            pipe.hset(f"{broker.namespace}:{queue}.msgs", mapping=encoded)
            pipe.rpush(f"{broker.namespace}:{queue}", *encoded)
            pipe.execute()
        for message in messages:
            broker.emit_after("enqueue", message, None)
        return len(messages)

    def backlog(self, queue: str) -> int:
        """The queue's lists, a dead worker's ack sets until the sweep puts them back, and what
        the live workers hold, read from their snapshots (:mod:`reports.worker.held`), not from
        their ack sets: a message a dropped consumer left there would count as on its way for as
        long as the process lives. The queues are counted first, so a message taken in between
        is counted twice, not missed."""
        broker = self.broker
        namespace, client = broker.namespace, broker.client
        dead = redis_clock.dead_workers(client, f"{namespace}:__heartbeats__", timeout_ms=broker.heartbeat_timeout)
        with client.pipeline(transaction=False) as pipe:
            pipe.llen(f"{namespace}:{queue}")
            pipe.llen(f"{namespace}:{queue}.DQ")
            for worker in dead:
                acks = f"{namespace}:__acks__.{worker.decode()}.{queue}"
                pipe.scard(acks)
                pipe.scard(f"{acks}.DQ")
            counts = pipe.execute()
        return sum(int(count) for count in counts) + held.held_of(held.read(client, namespace), queue)


class RabbitmqQueue(_BrokerQueue):
    broker: ReportsRabbitmqBroker

    def _enqueue_chunk(self, queue: str, messages: list[dramatiq.Message[Any]]) -> int:
        """Published with one wait for the chunk's publisher confirms."""
        return rabbitmq.publish_confirmed(self.broker, queue, messages)

    def backlog(self, queue: str) -> int:
        """RabbitMQ tells only what no consumer holds; what the workers hold comes from their
        snapshots in the shared Redis (:mod:`reports.worker.held`)."""
        ready, delayed, _dead = rabbitmq.ready_counts(self.broker, queue)
        return ready + delayed + held.held_of(held.read(self.broker.shared_redis, self.broker.namespace), queue)


class SqsQueue(_BrokerQueue):
    broker: ReportsSqsBroker

    def _enqueue_chunk(self, queue: str, messages: list[dramatiq.Message[Any]]) -> int:
        """Sent in batch calls of ten, several at once."""
        return self.broker.enqueue_many(queue, messages)

    def backlog(self, queue: str) -> int:
        """What SQS counts: ready, delayed, and in flight (received by a worker and not yet
        deleted, a dead worker's too until its visibility timeout runs out and they are ready
        again). Approximate: docs/howto/sqs.md says what that costs."""
        return sum(self.broker.depths(queue))
