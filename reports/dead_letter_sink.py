"""Where dead messages go: the durable store, one ERROR line, and the rate-limited alert.

Also a Dramatiq middleware for the messages Dramatiq dead-letters by itself (an actor no worker
declares, a message that cannot be decoded, or the retry middleware's last resort): they are moved from the broker's ``.XQ`` keys
into the same store, when they are rejected and again whenever a worker boots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware
from sqlalchemy.orm import Session, sessionmaker

from reports import dead_letters
from reports.alerts import WebhookAlerts
from reports.retries import DeadMessage

logger = logging.getLogger(__name__)


class DeadLetterSink:
    """Called by the retry middleware with every message that died."""

    def __init__(
        self, sessions: sessionmaker[Session], *, alerts: WebhookAlerts | None,
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
        if self.on_stored is not None:
            self.on_stored(dead)
        about = dead_letters.ids(dead)
        subject = " ".join(f"{k}={v}" for k, v in about.items())
        logger.error(
            "Dead letter: message %s of %s on %s (%s), %s after %d attempt(s): %s.",
            dead.message_id, dead.actor, dead.queue, subject or "no ids", dead.reason, dead.attempts,
            dead.error_class,
            extra={"message_id": dead.message_id, "actor": dead.actor, "queue": dead.queue,
                   "reason": dead.reason, "attempts": dead.attempts, "error_class": dead.error_class,
                   **about},
        )
        if self.alerts is not None:
            try:
                self.alerts.dead_letter(dead)
            except redis.RedisError:
                logger.warning("Dead-letter alert skipped: Redis unreachable.")


class BrokerDeadLetters(Middleware):
    """Moves messages that Dramatiq rejected into its ``.XQ`` keys into the dead-letter store."""

    def __init__(self, sink: Any) -> None:
        #: A callable returning the sink, so the engine is built inside the worker process.
        self._sink = sink

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._sweep(broker)

    def after_nack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._sweep(broker)

    def after_undecodable_message(self, broker: dramatiq.Broker, queue_name: str, redis_message_id: str) -> None:
        """Called by :mod:`reports.undecodable` once it moved such a message into ``.XQ``."""
        self._sweep(broker)

    def _sweep(self, broker: dramatiq.Broker) -> None:
        if not isinstance(broker, RedisBroker):
            return
        try:
            moved = dead_letters.absorb_broker_dead_letters(broker.client, broker.namespace, self._sink())
        except Exception:
            # The message stays in .XQ and the next sweep tries again.
            logger.warning("Could not move the broker's dead letters into the store.", exc_info=True)
            return
        if moved:
            logger.info("Moved %d message(s) from the broker's dead-letter queues into the store.", moved)
