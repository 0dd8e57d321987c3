"""Where dead messages go: the durable store, one ERROR line, and the rate-limited alert.

Also a Dramatiq middleware for the messages Dramatiq dead-letters by itself (an actor no worker
declares, a message that cannot be decoded, or the retry middleware's last resort when the store
was unreachable, and on SQS a message received too many times): they are moved from the broker's
``.XQ`` keys (Redis), queues (RabbitMQ) or dead-letter queues (SQS) into the same store when they
are rejected, when a worker boots, and on a timer in every worker process, so that a dead letter
the store could not take comes in once it is reachable again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware
from sqlalchemy.orm import Session, sessionmaker

from reports.dead_message import DeadMessage
from reports.failures import dead_letters
from reports.failures.alerts import WebhookAlerts
from reports.models import DeadLetterReason
from reports.worker import rabbitmq
from reports.worker.broker import is_sqs

if TYPE_CHECKING:
    from reports.worker.sqs_consumer import ReportsSqsBroker

logger = logging.getLogger(__name__)


class DeadLetterSink:
    """Called by the retry middleware with every message that died."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        alerts: WebhookAlerts | None,
        on_stored: Callable[[DeadMessage], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.alerts = alerts
        self.on_stored = on_stored

    def __call__(self, dead: DeadMessage) -> None:
        with self.sessions.begin() as session:
            stored = dead_letters.record(session, dead)
        if not stored:
            return  # a redelivered copy of a message already stored
        # Stored and committed: what follows tells of it, and nothing in it may fail the message,
        # which would send a stored letter to .XQ as unstored and lose this line and the alert.
        about = dead_letters.ids(dead)
        subject = " ".join(f"{k}={v}" for k, v in about.items())
        logger.error(
            "Dead letter: message %s of %s on %s (%s), %s after %d attempt(s): %s.",
            dead.message_id,
            dead.actor,
            dead.queue,
            subject or "no ids",
            dead.reason,
            dead.attempts,
            dead.error_class,
            extra={
                "message_id": dead.message_id,
                "actor": dead.actor,
                "queue": dead.queue,
                "reason": dead.reason,
                "attempts": dead.attempts,
                "error_class": dead.error_class,
                **about,
            },
        )
        tellings = [("count", self.on_stored), ("alert", self.alerts.dead_letter if self.alerts else None)]
        for what, tell in tellings:
            if tell is None:
                continue
            try:
                tell(dead)
            except redis.RedisError:
                logger.warning("Dead-letter %s skipped: Redis unreachable.", what)


class BrokerDeadLetters(Middleware):
    """Moves messages that Dramatiq rejected into its ``.XQ`` keys into the dead-letter store.

    :param sink: what stores each dead message (a :class:`DeadLetterSink`, or one built on first use).
    :param interval_seconds: how often each worker process sweeps, from its boot to its shutdown.
    """

    def __init__(self, sink: Callable[[DeadMessage], None], *, interval_seconds: float) -> None:
        self._sink = sink
        self.interval_seconds = interval_seconds
        self._stopped = threading.Event()

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._sweep(broker)
        self._stopped.clear()
        threading.Thread(
            target=self._sweep_until_stopped, args=(broker,), name="dead-letter-sweep", daemon=True
        ).start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._stopped.set()

    def _sweep_until_stopped(self, broker: dramatiq.Broker) -> None:
        # Processes sweep at once, each message taken by one (RabbitMQ) or stored by each under
        # its id, which the store keeps once (Redis); it leaves the broker only once stored.
        while not self._stopped.wait(self.interval_seconds):
            self._sweep(broker)
            if isinstance(broker, RabbitmqBroker):
                # Idle until the next sweep, this thread's connection would miss its heartbeats.
                del broker.connection

    def after_nack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._sweep(broker)

    def after_undecodable_message(
        self, broker: dramatiq.Broker, queue_name: str, broker_message_id: str, body: bytes
    ) -> None:
        """Called by the consumers with a message they could not decode, and on RabbitMQ and SQS
        also with one Dramatiq rejected (:func:`reports.worker.rejects.store`).

        On Redis (:mod:`reports.worker.consumer`) it is in ``.XQ`` already and is swept from
        there. On RabbitMQ and SQS it is still held by the consumer and is stored here; an error
        is raised to the consumer, which then moves it into the broker's dead-letter queue.
        """
        if not isinstance(broker, RedisBroker):
            self._sink(_broker_dead_message(body, broker_message_id, queue_name, int(time.time() * 1000)))
            return
        self._sweep(broker)

    def _sweep(self, broker: dramatiq.Broker) -> None:
        try:
            if isinstance(broker, RedisBroker):
                moved = absorb_broker_dead_letters(broker.client, broker.namespace, self._sink)
            elif isinstance(broker, RabbitmqBroker):
                moved = absorb_rabbitmq_dead_letters(broker, self._sink)
            elif is_sqs(broker):
                moved = absorb_sqs_dead_letters(broker, self._sink)
            else:
                return
        except Exception:
            # The message stays in .XQ and the next sweep tries again.
            logger.warning("Could not move the broker's dead letters into the store.", exc_info=True)
            return
        if moved:
            logger.info("Moved %d message(s) from the broker's dead-letter queues into the store.", moved)


#: Characters of an undecodable message's bytes kept (as text, undecodable bytes replaced).
UNDECODABLE_TEXT_KEPT = 2000


def absorb_broker_dead_letters(client: redis.Redis, namespace: str, on_dead: Callable[[DeadMessage], None]) -> int:
    """Hand whatever Dramatiq dead-lettered into its own ``.XQ`` keys to ``on_dead``; returns how many.

    Dramatiq puts messages there itself for an actor no worker knows, and the retry middleware
    does as a last resort when the database was unreachable. Left there they expire silently.
    Each is removed from the broker only after ``on_dead`` has returned.
    """
    moved = 0
    for xq in client.scan_iter(match=f"{namespace}:*.XQ", count=100):
        xq_key = cast(bytes, xq).decode()
        queue = xq_key.removeprefix(f"{namespace}:").removesuffix(".XQ").removesuffix(".DQ")
        entries = cast(list[tuple[bytes, float]], client.zrange(xq_key, 0, 499, withscores=True))
        for redis_id, died_ms in entries:
            raw = cast(bytes | None, client.hget(f"{xq_key}.msgs", redis_id))
            if raw is not None:
                try:
                    on_dead(_broker_dead_message(raw, redis_id.decode(), queue, int(died_ms)))
                except Exception:
                    # One entry that cannot be stored must not keep every later one in .XQ.
                    logger.exception("Could not store broker dead letter %s; leaving it in %s.", redis_id, xq_key)
                    continue
                moved += 1
            client.zrem(xq_key, redis_id)
            client.hdel(f"{xq_key}.msgs", redis_id)
    return moved


def absorb_rabbitmq_dead_letters(broker: RabbitmqBroker, on_dead: Callable[[DeadMessage], None]) -> int:
    """:func:`absorb_broker_dead_letters` for RabbitMQ: the ``.XQ`` queue of each queue this process declared."""
    died_ms = int(time.time() * 1000)
    moved = 0
    for queue in sorted(broker.get_declared_queues()):

        def store(raw: bytes, broker_id: str, queue: str = queue) -> None:
            on_dead(_broker_dead_message(raw, broker_id, queue, died_ms))

        moved += rabbitmq.take_dead_letters(broker, queue, store)
    return moved


def absorb_sqs_dead_letters(broker: ReportsSqsBroker, on_dead: Callable[[DeadMessage], None]) -> int:
    """:func:`absorb_broker_dead_letters` for SQS: the dead-letter queue of each queue this process
    declared, where the workers move what they reject and SQS what was received too many times."""
    from reports.worker import sqs  # imported with the SQS broker, never before it

    died_ms = int(time.time() * 1000)
    moved = 0
    for queue in sorted(broker.get_declared_queues()):

        def store(raw: bytes, message_id: str, rejected: bool, queue: str = queue) -> None:
            why = None if rejected else REDRIVEN
            on_dead(_broker_dead_message(raw, message_id, queue, died_ms, error_message=why))

        moved += sqs.take_dead_letters(broker.client, broker.dead_letter_url_of(queue), store)
    return moved


#: What a dead letter SQS moved by itself (its redrive policy) says.
REDRIVEN = (
    "Received more times than SQS_MAX_RECEIVE_COUNT without being settled (a worker that died each time "
    "it ran it), so SQS moved it to the dead-letter queue."
)


def _broker_dead_message(
    raw: bytes, redis_id: str, queue: str, died_ms: int, *, error_message: str | None = None
) -> DeadMessage:
    try:
        message: dramatiq.Message[Any] = dramatiq.Message.decode(raw)
    except dramatiq.DecodeError as error:
        return _undecodable(raw, redis_id, queue, died_ms, error)
    return DeadMessage(
        message_id=message.message_id,
        actor=message.actor_name,
        queue=queue,
        args=tuple(message.args),
        kwargs=dict(message.kwargs),
        attempts=int(message.options.get("retries", 0)) + 1,
        reason=DeadLetterReason.BROKER,
        error_class="BrokerDeadLetter",
        error_message=error_message or "Dead-lettered by Dramatiq itself (for example: no worker declares this actor).",
        traceback=message.options.get("traceback") or "",
        first_failed_ms=int(message.options.get("first_failed_ms", died_ms)),
        died_ms=died_ms,
    )


def _undecodable(raw: bytes, redis_id: str, queue: str, died_ms: int, error: dramatiq.DecodeError) -> DeadMessage:
    """What is known of a message that never decoded: its queue, its broker id and its bytes."""
    text = raw.decode("utf-8", errors="replace")[:UNDECODABLE_TEXT_KEPT]
    return DeadMessage(
        message_id=redis_id,
        actor="",
        queue=queue,
        args=(),
        kwargs={},
        attempts=1,
        reason=DeadLetterReason.UNDECODABLE,
        error_class=type(error.error).__name__,
        error_message=f"The message could not be decoded: {text}",
        traceback="",
        first_failed_ms=died_ms,
        died_ms=died_ms,
    )
