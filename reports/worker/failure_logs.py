"""Dramatiq's worker logs every exception an actor raises as an ERROR with its traceback ("Failed
to process message … with unhandled exception"), routine retries included. The retry middleware
(:mod:`reports.worker.retries`) and the dead-letter sink log each failure once, in a line that says
what happens next; this filter drops Dramatiq's record when the exception is an expected one, and
keeps it, traceback and all, for anything else: a bug.
"""

from __future__ import annotations

import logging

import redis
import sqlalchemy.exc

from reports.errors import ReportsError

#: The logger of Dramatiq's worker threads (``dramatiq.worker._WorkerThread``), where the record comes from.
WORKER_THREAD_LOGGER = "dramatiq.worker.WorkerThread"

#: Failures that are outcomes, not bugs: ours (permanent, transient, deferred), and the outages of
#: the services the workers need (Redis, the database), which the retries ride out.
EXPECTED = (ReportsError, redis.ConnectionError, redis.TimeoutError, sqlalchemy.exc.OperationalError)


def is_expected(exception: BaseException) -> bool:
    return isinstance(exception, EXPECTED)


class DropExpectedFailures(logging.Filter):
    """Drops Dramatiq's ERROR record of an expected failure; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.exc_info:
            return True
        exception = record.exc_info[1]
        return exception is None or not is_expected(exception)


def install() -> None:
    """Attach the filter to Dramatiq's worker-thread logger (a logger's filters see only its own records)."""
    worker_logger = logging.getLogger(WORKER_THREAD_LOGGER)
    if not any(isinstance(f, DropExpectedFailures) for f in worker_logger.filters):
        worker_logger.addFilter(DropExpectedFailures())
