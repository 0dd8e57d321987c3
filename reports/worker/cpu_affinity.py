"""Each worker process of a pool kept on one CPU of its own (``WORKER_CPU_AFFINITY=auto``).

A worker process's threads take turns holding CPython's GIL, handing it over at every blocking call
(a statement, an SMTP reply), some twenty times a report. Spread over several CPUs, each hand-over
wakes a thread on another CPU, which then waits for the GIL there; kept on one CPU, the thread that
lets go simply runs the next one. Why and when to turn it on: docs/howto/throughput.md.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Collection

import dramatiq
from dramatiq.middleware import Middleware

logger = logging.getLogger(__name__)

#: Where Linux lists a process's threads.
_TASKS = "/proc/self/task"


def process_number(name: str) -> int | None:
    """Which child of its master a worker process is, from its ``multiprocessing`` name
    (``Process-3`` is the third; a grandchild's name lists each parent's count: ``Process-1:3``),
    or ``None`` for a name the process was given."""
    prefix, _, counts = name.partition("-")
    last = counts.rpartition(":")[2]
    return int(last) if prefix == "Process" and last.isdigit() else None


def cpu_for(number: int, allowed: Collection[int]) -> int:
    """The CPU the ``number``-th worker process (from 1) keeps to: the CPUs the process may use,
    in order, one process each, starting again from the first when there are more processes."""
    cpus = sorted(allowed)
    return cpus[(number - 1) % len(cpus)]


class PinToCpu(Middleware):
    """Keeps every thread of the worker process, those it starts later included, on one CPU."""

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        number = process_number(multiprocessing.current_process().name)
        if number is None:  # a test's in-process worker, or a process that is not a pool's
            return
        if not hasattr(os, "sched_setaffinity"):
            logger.warning("WORKER_CPU_AFFINITY=auto needs Linux: this worker process runs on any CPU.")
            return
        cpu = cpu_for(number, os.sched_getaffinity(0))
        # A thread started from now on inherits its starter's CPU; those already running are moved.
        for thread_id in os.listdir(_TASKS):
            try:
                os.sched_setaffinity(int(thread_id), {cpu})
            except ProcessLookupError:  # a thread that has ended since the listing
                continue
        logger.info("Worker process %d runs on CPU %d.", number, cpu)
