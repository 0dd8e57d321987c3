"""Dramatiq middleware: each message's processing time and outcome, counted fleet-wide in Redis.

Counting in Redis rather than in each worker process's memory is what keeps the figures right
under the ``dramatiq`` CLI's many processes: no per-process files that outlive a restart, no
retry counted twice, nothing lost when a process is replaced. ``reports exporter`` reads the
counts at scrape time (:mod:`reports.metrics`).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.middleware import CurrentMessage, Middleware

from reports.metrics import DURATION_BUCKETS, SEP, counter_key
from reports.retries import OUTCOME_OPTION

logger = logging.getLogger(__name__)



def bucket_label(seconds: float) -> str:
    """The bucket a duration falls in, as the ``le`` label of its upper bound."""
    index = bisect.bisect_left(DURATION_BUCKETS, seconds)
    return repr(DURATION_BUCKETS[index]) if index < len(DURATION_BUCKETS) else "+Inf"


def note_outcome(outcome: str) -> None:
    """Tell the metrics what the running message came to (``skipped``, ``deferred``…).

    Left on the message rather than returned: Dramatiq warns about every actor result that no
    Results middleware stores.
    """
    message = CurrentMessage.get_current_message()
    if message is not None:
        message.options[OUTCOME_OPTION] = outcome


def outcome_of(exception: BaseException | None, message: MessageProxy) -> str:
    """The retry verdict after a failure; otherwise ``success`` or what the actor noted."""
    if exception is not None:
        return str(message.options.get(OUTCOME_OPTION, "retry"))
    noted = message.options.get(OUTCOME_OPTION)
    return "success" if noted in (None, "delivered") else str(noted)


class ActorMetrics(Middleware):
    """Must sit before the retry middleware: ``after_*`` hooks run in reverse, so it sees the verdict."""

    def __init__(self, client: redis.Redis, *, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self._started = threading.local()

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._started.at = time.perf_counter()

    def after_process_message(
        self, broker: dramatiq.Broker, message: MessageProxy, *, result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        started = getattr(self._started, "at", None)
        if started is None:
            return
        self._started.at = None
        seconds = time.perf_counter() - started
        actor = message.actor_name
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hincrby(counter_key(self.namespace, "actor_outcomes"),
                             SEP.join((actor, outcome_of(exception, message))), 1)
                pipe.hincrby(counter_key(self.namespace, "actor_duration_buckets"),
                             SEP.join((actor, bucket_label(seconds))), 1)
                pipe.hincrbyfloat(counter_key(self.namespace, "actor_duration_sum"), actor, seconds)
                pipe.execute()
        except redis.RedisError:
            logger.warning("Could not record metrics for message %s.", message.message_id)
