"""Dramatiq middleware: each message's processing time and outcome, counted fleet-wide in Redis.

Counts gather in the process's memory and a thread writes them once per
:data:`FLUSH_INTERVAL_SECONDS` in one round trip; ``reports exporter`` reads them
(docs/explanation/architecture.md, "Inside a worker").
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.middleware import CurrentMessage, Middleware

from reports.counters import DURATION_BUCKETS, FALLBACKS, FALLBACKS_COUNTER, SEP, counter_key
from reports.outcome import Kind
from reports.worker.retries import OUTCOME_OPTION

logger = logging.getLogger(__name__)

#: How often each worker process writes its counts to Redis, in seconds.
FLUSH_INTERVAL_SECONDS = 1.0

#: How long shutdown waits for a flush in progress before its own final one, in seconds.
_FLUSHER_JOIN_SECONDS = 5.0


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
        return str(message.options.get(OUTCOME_OPTION, Kind.RETRY))
    noted = message.options.get(OUTCOME_OPTION)
    return Kind.SUCCESS if noted in (None, Kind.DELIVERED) else str(noted)


_Key = tuple[str, str]  # (Redis hash, field)


class _Tally:
    """Counts and sums added since the last flush, by Redis hash and field; safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[_Key, int] = {}
        self._sums: dict[_Key, float] = {}

    def add(self, counts: Iterable[tuple[_Key, int]], sums: Iterable[tuple[_Key, float]]) -> None:
        with self._lock:
            for key, count in counts:
                self._counts[key] = self._counts.get(key, 0) + count
            for key, value in sums:
                self._sums[key] = self._sums.get(key, 0.0) + value

    def take(self) -> tuple[dict[_Key, int], dict[_Key, float]]:
        """Everything added so far; the tally starts again from nothing."""
        with self._lock:
            taken = self._counts, self._sums
            self._counts, self._sums = {}, {}
        return taken


class ActorMetrics(Middleware):
    """Must sit before the retry middleware: ``after_*`` hooks run in reverse, so it sees the verdict.

    :param flush_interval_seconds: how often the counts go to Redis (:data:`FLUSH_INTERVAL_SECONDS`).
    """

    def __init__(
        self, client: redis.Redis, *, namespace: str, flush_interval_seconds: float = FLUSH_INTERVAL_SECONDS
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.flush_interval_seconds = flush_interval_seconds
        # The hashes every message adds to, named once rather than per message.
        self._outcomes = counter_key(namespace, "actor_outcomes")
        self._buckets = counter_key(namespace, "actor_duration_buckets")
        self._sums = counter_key(namespace, "actor_duration_sum")
        self._started = threading.local()
        self._tally = _Tally()
        self._flusher_lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._flusher_pid: int | None = None
        self._stop = threading.Event()

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._ensure_flusher()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """The worker threads are done: stop the flusher and write what is left."""
        self._stop.set()
        if self._flusher is not None and self._flusher_pid == os.getpid():
            self._flusher.join(timeout=_FLUSHER_JOIN_SECONDS)
        if not self.flush():
            logger.warning("Metrics of this worker's last moments are lost: Redis unreachable at shutdown.")

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._started.at = time.perf_counter()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        started = getattr(self._started, "at", None)
        if started is None:
            return
        self._started.at = None
        seconds = time.perf_counter() - started
        actor = message.actor_name
        self._ensure_flusher()
        outcome = (self._outcomes, SEP.join((actor, outcome_of(exception, message))))
        bucket = (self._buckets, SEP.join((actor, bucket_label(seconds))))
        total = (self._sums, actor)
        self._tally.add(((outcome, 1), (bucket, 1)), ((total, seconds),))

    def flush(self) -> bool:
        """Write the counts added since the last flush in one round trip; False if Redis was unreachable
        (they are kept for the next flush)."""
        fallbacks = counter_key(self.namespace, FALLBACKS_COUNTER)
        self._tally.add((((fallbacks, fact), n) for fact, n in FALLBACKS.drain().items()), ())
        counts, sums = self._tally.take()
        if not counts and not sums:
            return True
        try:
            with self.client.pipeline(transaction=True) as pipe:
                for (key, field), count in counts.items():
                    pipe.hincrby(key, field, count)
                for (key, field), total in sums.items():
                    pipe.hincrbyfloat(key, field, total)
                pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError):
            self._tally.add(counts.items(), sums.items())
            logger.warning("Could not write actor metrics: Redis unreachable; kept for the next flush.")
            return False
        except redis.RedisError:
            logger.exception("Redis refused the actor metrics; %d counts dropped.", sum(counts.values()))
        return True

    def _ensure_flusher(self) -> None:
        """One flusher per process: a forked worker starts its own, and drops the parent's counts,
        which the parent flushes itself."""
        if self._flusher_pid == os.getpid():
            return
        with self._flusher_lock:
            if self._flusher_pid == os.getpid():
                return
            if self._flusher_pid is not None:
                self._tally, self._stop = _Tally(), threading.Event()
            self._flusher = threading.Thread(target=self._flush_every_interval, name="actor-metrics", daemon=True)
            self._flusher.start()
            self._flusher_pid = os.getpid()

    def _flush_every_interval(self) -> None:
        stop = self._stop
        while not stop.wait(self.flush_interval_seconds):
            try:
                self.flush()
            except Exception:  # the flusher must outlive any one bad flush
                logger.exception("Actor metrics flush failed.")
