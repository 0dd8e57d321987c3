"""Dramatiq middleware for a worker process's life: a heartbeat of its own, and one drain per SIGTERM
(why: docs/explanation/architecture.md, "Inside a worker").
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.compat import StreamablePipe
from dramatiq.middleware import Middleware

from reports import parent_death
from reports.worker import redis_clock

logger = logging.getLogger(__name__)

#: Set once the process has been asked to drain; long steps check it to stop early.
draining = threading.Event()


class Heartbeat(Middleware):
    def __init__(self, *, interval_seconds: float) -> None:
        self.interval_seconds = interval_seconds

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if isinstance(broker, RedisBroker):
            threading.Thread(target=self._beat, args=(broker,), name="heartbeat", daemon=True).start()

    def _beat(self, broker: RedisBroker) -> None:
        key = f"{broker.namespace}:__heartbeats__"
        # Beats on through the drain, while in-flight messages finish; ends with the process.
        while True:
            time.sleep(self.interval_seconds)
            try:
                # The write the broker's calls make: broker id → now, in ms, on Redis's clock.
                redis_clock.heartbeat(broker.client)(keys=[key], args=[broker.broker_id])
            except redis.RedisError:
                logger.warning("Heartbeat could not reach Redis.")


class AfterBoot(Middleware):
    """Call ``booted`` once the worker process has started its worker (not when it is imported)."""

    def __init__(self, booted: Callable[[], None]) -> None:
        self.booted = booted

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.booted()


class DrainOnce(Middleware):
    """Treat repeated SIGTERMs within ``window_seconds`` of the first as one request to drain."""

    def __init__(self, *, window_seconds: float) -> None:
        self.window_seconds = window_seconds

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        original = signal.getsignal(signal.SIGTERM)
        if callable(original):
            signal.signal(
                signal.SIGTERM,
                coalesce_term_signals(
                    original, window_seconds=self.window_seconds, already_had_one=has_stopped(original)
                ),
            )


def has_stopped(handler: Callable[..., Any]) -> bool:
    """Whether Dramatiq's worker-process handler has had its SIGTERM already: one that came while the
    process was still importing the actors, before this middleware could wrap it. A platform
    signals the whole group, and the master passes the same request on once its workers have
    booted: that second SIGTERM would be Dramatiq's "kill" (exit 1, no drain) instead of the
    repeat it is. Dramatiq keeps that state as ``running`` in its handler's closure (it is pinned)."""
    code, closure = getattr(handler, "__code__", None), getattr(handler, "__closure__", None)
    if code is None or closure is None:
        return False
    running = dict(zip(code.co_freevars, closure, strict=True)).get("running")
    return running is not None and running.cell_contents is False


def coalesce_term_signals(
    original: Callable[[int, FrameType | None], Any],
    *,
    window_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    already_had_one: bool = False,
) -> Callable[[int, FrameType | None], Any]:
    """``original``, called for the first SIGTERM of each burst; ``already_had_one``: the burst's
    first reached ``original`` before this wrapper was installed, so it starts now."""
    first_at: float | None = clock() if already_had_one else None
    if already_had_one:
        draining.set()

    def handler(signum: int, frame: FrameType | None) -> Any:
        nonlocal first_at
        now = clock()
        if first_at is not None and now - first_at < window_seconds:
            logger.info("Ignoring a repeated SIGTERM: already draining.")
            return None
        first_at = now
        draining.set()
        return original(signum, frame)

    return handler


#: How often a worker process looks whether its master is still its parent, in seconds.
MASTER_CHECK_SECONDS = 0.5
#: How long the main thread has to begin the drain once the master is gone: it looks for the
#: signal once a second, unless Dramatiq's boot is stuck (see :class:`StopWithMaster`).
MAIN_THREAD_GRACE_SECONDS = 5.0
#: What a drain the watcher runs itself gives in-flight messages: the Procfile's --worker-shutdown-timeout.
ORPHAN_DRAIN_TIMEOUT_MS = 20_000
#: The exit code of a process whose logging was already wedged when its master died: stopped at
#: once, as ``kill -9`` would, its messages given back by the broker.
EXIT_LOGGING_WEDGED = 1


class StopWithMaster(Middleware):
    """A worker process drains and stops when its ``dramatiq`` master dies, even by ``kill -9``.

    Left alone it runs on as an orphan holding the read end of its own logging pipe: once 64 KiB of
    log lines fill that pipe with no master to read it, the next log call blocks for good, holding
    the logging lock, and the process wedges with its broker connection (RabbitMQ) or heartbeat
    (Redis) still alive, so the messages it has fetched are neither run nor given back, and
    reconcile counts them as held by a live worker. On Linux the process asks for SIGTERM when its
    master ends (the drain every SIGTERM starts); elsewhere nothing.

    A thread of its own watches for the master's end too. It points the process's logging at its
    own stderr (the platform's log), away from the pipe nobody reads; and if the main thread has not
    begun the drain shortly after, it drains the worker itself. That happens when the master dies
    while it waits for this process to boot: Dramatiq's worker process, its threads already
    consuming, tells the master it has booted through a ``multiprocessing.Event``, whose ``set``
    waits for every process waiting on it, and a dead master never answers, so the main thread
    never reaches the loop that would act on the SIGTERM.
    """

    def __init__(self) -> None:
        self._master: int | None = None
        self._stopping = threading.Event()

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        master = multiprocessing.parent_process()
        if master is not None and master.pid is not None:  # None: a test's in-process worker
            self._master = master.pid
            parent_death.terminate_with(master.pid)

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self._master is not None:
            threading.Thread(
                target=self._watch, args=(broker, worker, self._master), name="stop-with-master", daemon=True
            ).start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._stopping.set()

    def _watch(self, broker: dramatiq.Broker, worker: dramatiq.Worker, master: int) -> None:
        while os.getppid() == master:
            if self._stopping.wait(MASTER_CHECK_SECONDS):
                return
        if not log_to_own_stderr():
            # A thread blocked on the full pipe holds the logging lock: no drain can log, so none
            # can finish. The broker gives the messages back, as after kill -9.
            os._exit(EXIT_LOGGING_WEDGED)
        if self._stopping.wait(MAIN_THREAD_GRACE_SECONDS):
            return
        logger.warning("The dramatiq master died while this worker process booted: draining it here.")
        worker.stop(timeout=ORPHAN_DRAIN_TIMEOUT_MS)
        broker.close()
        # The main thread is still waiting for the dead master, for good.
        os._exit(0)


def log_to_own_stderr(lock_timeout_seconds: float = 1.0) -> bool:
    """Point the handlers that write into Dramatiq's logging pipe, and ``sys.stdout`` and
    ``sys.stderr``, at the process's own stderr; ``False`` if a handler's lock was held longer than
    ``lock_timeout_seconds`` (a write to the pipe blocked, holding it)."""
    stream = sys.__stderr__
    if stream is None:
        return True
    sys.stdout = sys.stderr = stream
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.StreamHandler) or not isinstance(handler.stream, StreamablePipe):
            continue
        lock = handler.lock
        if lock is None or not lock.acquire(timeout=lock_timeout_seconds):
            return False
        try:
            handler.stream = stream
        finally:
            lock.release()
    return True
