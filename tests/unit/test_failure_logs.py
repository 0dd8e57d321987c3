"""Dramatiq's traceback record of an expected failure is dropped; a bug's is kept."""

from __future__ import annotations

import logging
import sys

import pytest

from reports.errors import MailDeferred, MailRejected
from reports.worker.failure_logs import DropExpectedFailures


def record_of(error: BaseException, level: int = logging.ERROR) -> logging.LogRecord:
    try:
        raise error
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord(
        "dramatiq.worker.WorkerThread",
        level,
        __file__,
        1,
        "Failed to process message %s with unhandled exception.",
        ("m",),
        exc_info,
    )


@pytest.mark.parametrize("error", [MailDeferred(451, "4.3.0 try later"), MailRejected(552, "5.3.4 too big")])
def test_an_expected_failure_is_not_logged_by_dramatiq(error: BaseException) -> None:
    assert not DropExpectedFailures().filter(record_of(error))


@pytest.mark.parametrize("error", [KeyError("bug"), ZeroDivisionError()])
def test_a_bug_keeps_its_traceback(error: BaseException) -> None:
    assert DropExpectedFailures().filter(record_of(error))


def test_records_without_an_exception_pass() -> None:
    record = logging.LogRecord("dramatiq.worker.WorkerThread", logging.INFO, __file__, 1, "hello", (), None)
    assert DropExpectedFailures().filter(record)
