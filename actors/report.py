"""The per-user actors: the monthly report, and a report someone asked for now."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import dramatiq

from actors import broker, runtime
from reports.delivery import pipeline
from reports.errors import Deferred
from reports.jobs import BUILD_REPORT, SEND_NOW, ReportJob, SendNowJob
from reports.worker.actor_metrics import note_outcome
from reports.worker.broker import defer_current
from reports.worker.retries import MessageOutcome

#: Added to a deferral, as a fraction of its wait, so deferred copies do not return together.
DEFER_JITTER = 0.5


def _deferring(step: Callable[[], pipeline.Outcome]) -> None:
    """Run ``step`` and note its outcome for the metrics; a deferral re-enqueues the message."""
    try:
        note_outcome(str(step()))
    except Deferred as deferred:
        # Another copy holds the claim, or the provider's breaker is open: come back later,
        # without spending a retry.
        wait_ms = deferred.retry_after_seconds * 1000
        delay_ms = int(wait_ms + random.uniform(100, 100 + wait_ms * DEFER_JITTER))
        defer_current(broker, delay_ms=delay_ms, reason=f"{type(deferred).__name__}: {deferred}")
        note_outcome(MessageOutcome.DEFERRED)  # after the copy is enqueued, so the copy does not carry it


@dramatiq.actor(actor_name=BUILD_REPORT.name, queue_name=BUILD_REPORT.queue)
def build_report(*args: Any, **kwargs: Any) -> None:
    job = ReportJob.parse(args, kwargs)
    _deferring(lambda: pipeline.run(runtime.context, job))


@dramatiq.actor(actor_name=SEND_NOW.name, queue_name=SEND_NOW.queue)
def send_report_now(*args: Any, **kwargs: Any) -> None:
    job = SendNowJob.parse(args, kwargs)
    _deferring(lambda: pipeline.send_now(runtime.context, job))
