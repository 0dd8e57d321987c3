"""The Dramatiq broker, built in one place from the settings for workers and producers alike."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Retries, default_middleware

from reports.jobs import ActorSpec
from reports.settings import Settings
from reports.undecodable import UndecodableAsDeadLetters


def build_broker(settings: Settings) -> RedisBroker:
    """A Redis broker whose dead workers' messages come back in seconds, not minutes.

    Every process, producers included, must use the same heartbeat settings: the sweep that
    requeues a dead worker's messages runs inside whichever process's broker call wins the
    ``maintenance_chance`` draw.
    """
    # Dramatiq's Retries is left out: workers add reports.retries.JitteredRetries, which
    # needs the dead-letter store.
    middleware = [m() for m in default_middleware if m is not Retries]
    middleware.append(CurrentMessage())
    return UndecodableAsDeadLetters(
        url=settings.broker_url,
        namespace=settings.broker_namespace,
        heartbeat_timeout=settings.heartbeat_timeout_ms,
        maintenance_chance=settings.maintenance_chance,
        middleware=middleware,
    )


def message_for(
    spec: ActorSpec, payload: Mapping[str, Any], *, options: dict[str, Any] | None = None
) -> dramatiq.Message[Any]:
    """A message for ``spec``'s actor, built without importing the actors (producers need only names)."""
    return dramatiq.Message(
        queue_name=spec.queue, actor_name=spec.name, args=spec.arguments(payload), kwargs={}, options=options or {}
    )


def send(broker: dramatiq.Broker, spec: ActorSpec, payload: Mapping[str, Any], *, delay_ms: int | None = None) -> None:
    broker.enqueue(message_for(spec, payload), delay=delay_ms)


#: Messages per Redis round trip in :func:`send_many`.
ENQUEUE_CHUNK = 1000


def send_many(broker: dramatiq.Broker, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
    """Enqueue one message per payload, a chunk per Redis round trip; returns how many were sent.

    Dramatiq has no bulk enqueue: ``actor.send`` costs one round trip and one script call per
    message. For a chunk of messages this writes, in one MULTI, exactly what the broker's
    ``dispatch`` script writes for each (the message in the queue's hash, its id on the queue's
    list), as one HSET and one RPUSH. It leans on the broker's key layout; Dramatiq is pinned.
    """
    if not isinstance(broker, RedisBroker):
        sent = 0
        for payload in payloads:
            broker.enqueue(message_for(spec, payload))
            sent += 1
        return sent
    sent = 0
    chunk: list[dramatiq.Message[Any]] = []
    for payload in payloads:
        # The first enqueue of a message: the id RedisBroker.enqueue would draw, drawn here.
        chunk.append(message_for(spec, payload, options={"redis_message_id": str(uuid.uuid4())}))
        if len(chunk) == ENQUEUE_CHUNK:
            sent += _enqueue_chunk(broker, spec.queue, chunk)
            chunk = []
    if chunk:
        sent += _enqueue_chunk(broker, spec.queue, chunk)
    return sent


def _enqueue_chunk(broker: RedisBroker, queue: str, messages: list[dramatiq.Message[Any]]) -> int:
    encoded: dict[str, bytes] = {}
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


def backlog(broker: dramatiq.Broker, queue: str) -> int:
    """Messages waiting in ``queue``, ready or delayed (Redis keys as the broker lays them out)."""
    if not isinstance(broker, RedisBroker):
        raise TypeError("backlog() reads a Redis broker's queues.")
    with broker.client.pipeline(transaction=False) as pipe:
        pipe.llen(f"{broker.namespace}:{queue}")
        pipe.llen(f"{broker.namespace}:{queue}.DQ")
        ready, delayed = pipe.execute()
    return int(ready) + int(delayed)


def defer_current(broker: dramatiq.Broker, *, delay_ms: int) -> None:
    """Run the message being processed again after ``delay_ms``, without spending a retry."""
    message = CurrentMessage.get_current_message()
    if message is None:
        raise RuntimeError("defer_current needs the CurrentMessage middleware and a running message.")
    broker.enqueue(message.copy(), delay=delay_ms)
