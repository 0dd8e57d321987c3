"""Dramatiq middleware: retry transient failures with jitter; hand everything else to the dead letters.

It replaces Dramatiq's ``Retries``. Permanent errors (see :mod:`reports.errors`) are never retried.
A dead message is handed to ``on_dead``, which stores it durably; the message is then acked, so
nothing piles up unseen in Dramatiq's own ``.XQ``. Only if storing fails is the message failed
into ``.XQ``, so that it is never lost.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware, TimeLimit

from reports.dead_message import DeadMessage
from reports.errors import PermanentError, ReportsError
from reports.models import DeadLetterReason
from reports.outcome import Kind
from reports.worker.backoff import full_jitter_ms
from reports.worker.broker import attempt_time, enqueue_until_sent

logger = logging.getLogger(__name__)

#: Where the verdict is left for the metrics middleware: ``retry`` or ``dead``.
OUTCOME_OPTION = "reports_outcome"


def is_permanent(exception: BaseException) -> bool:
    return isinstance(exception, PermanentError)


def reason(exception: BaseException) -> str:
    """What a log line says about a failure: our errors' own text (ids and the provider's reply,
    addresses masked), and only the class of anything else, whose text may quote personal data."""
    if isinstance(exception, ReportsError):
        return f"{type(exception).__name__}: {exception}"
    return type(exception).__name__


class JitteredRetries(Middleware):
    """Retry with full jitter; dead-letter permanent failures at once and exhausted ones at the end.

    Actors may override ``max_retries``, ``min_backoff`` and ``max_backoff`` (milliseconds).
    """

    def __init__(
        self,
        *,
        max_retries: int,
        min_backoff_ms: int,
        max_backoff_ms: int,
        on_dead: Callable[[DeadMessage], None],
        rng: random.Random | None = None,
    ) -> None:
        self.max_retries = max_retries
        self.min_backoff_ms = min_backoff_ms
        self.max_backoff_ms = max_backoff_ms
        self.on_dead = on_dead
        self.rng = rng or random.Random()

    @property
    def actor_options(self) -> set[str]:
        return {"max_retries", "min_backoff", "max_backoff"}

    def _option(self, broker: dramatiq.Broker, message: MessageProxy, name: str, default: int) -> int:
        actor_options = broker.get_actor(message.actor_name).options if message.actor_name in broker.actors else {}
        return int(message.options.get(name, actor_options.get(name, default)))

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is None:
            return
        # The actor is done: what follows (the retry's enqueue, waiting out a Redis failover; the
        # dead letter's store) must not be cut by its time limit, which Dramatiq ends only in its
        # own after-hook, run after this one. Cut, the message would be acked with no copy.
        _end_time_limit(broker)
        now_ms = int(time.time() * 1000)
        retries = int(message.options.get("retries", 0))
        message.options.setdefault("first_failed_ms", now_ms)
        max_retries = self._option(broker, message, "max_retries", self.max_retries)
        if is_permanent(exception) or retries >= max_retries:
            self._die(message, exception, retries, now_ms)
            message.options[OUTCOME_OPTION] = Kind.DEAD
            return
        message.options["retries"] = retries + 1
        delay = full_jitter_ms(
            retries,
            base_ms=self._option(broker, message, "min_backoff", self.min_backoff_ms),
            cap_ms=self._option(broker, message, "max_backoff", self.max_backoff_ms),
            rng=self.rng,
        )
        logger.warning(
            "Retrying message %s (%s) at %s, retry %d of %d: %s.",
            message.message_id,
            message.actor_name,
            attempt_time(now_ms + delay),
            retries + 1,
            max_retries,
            reason(exception),
            extra={"message_id": message.message_id, "actor": message.actor_name, "retries": retries + 1},
        )
        # Dramatiq's own Retries enqueues the proxy the same way: it copies what it enqueues.
        # Dramatiq swallows an error raised here and acks the message, so the retry must not fail.
        try:
            enqueue_until_sent(broker, message, delay_ms=delay)  # type: ignore[arg-type]
        except Exception:
            # A refusal no wait ends (Redis out of memory, say): to the broker's dead-letter queue,
            # and from there to the dead letters, rather than acked away with no copy.
            logger.critical(
                "Could not enqueue the retry of message %s; it goes to the dead letters.",
                message.message_id,
                exc_info=True,
                extra={"message_id": message.message_id, "actor": message.actor_name},
            )
            message.fail()
            message.options[OUTCOME_OPTION] = Kind.DEAD
            return
        # After the enqueue, so the retried copy does not carry it.
        message.options[OUTCOME_OPTION] = Kind.RETRY

    def _die(self, message: MessageProxy, exception: BaseException, retries: int, now_ms: int) -> None:
        dead = DeadMessage(
            message_id=message.message_id,
            actor=message.actor_name,
            queue=message.queue_name.removesuffix(".DQ"),
            args=tuple(message.args),
            kwargs=dict(message.kwargs),
            attempts=retries + 1,
            reason=DeadLetterReason.PERMANENT if is_permanent(exception) else DeadLetterReason.RETRIES_EXHAUSTED,
            error_class=type(exception).__name__,
            error_message=str(exception),
            traceback="".join(traceback.format_exception(exception)),
            first_failed_ms=int(message.options["first_failed_ms"]),
            died_ms=now_ms,
        )
        try:
            self.on_dead(dead)
        except Exception:
            logger.critical(
                "Could not store dead letter for message %s; leaving it in the broker's dead-letter queue.",
                message.message_id,
                exc_info=True,
            )
            message.fail()


def _end_time_limit(broker: dramatiq.Broker) -> None:
    for middleware in broker.middleware:
        if isinstance(middleware, TimeLimit):
            middleware.manager.remove_timeout(threading.get_ident())  # type: ignore[no-untyped-call]
