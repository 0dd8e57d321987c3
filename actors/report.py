"""The per-user actors: the monthly report, and a report someone asked for now."""

from __future__ import annotations

import random
from typing import Any

import dramatiq

from actors import broker, worker
from reports.delivery import pipeline
from reports.jobs import BUILD_REPORT, SEND_NOW, ReportJob, SendNowJob
from reports.outcome import Outcome
from reports.worker.actor_metrics import note_outcome
from reports.worker.broker import defer_current

#: Added to a deferral, as a fraction of its wait, so deferred copies do not return together.
DEFER_JITTER = 0.5


def _act_on(outcome: Outcome) -> None:
    """Note ``outcome`` for the metrics; a deferral re-enqueues the message, spending no retry."""
    if outcome.is_deferred:
        wait_ms = outcome.delay_seconds * 1000
        delay_ms = int(wait_ms + random.uniform(100, 100 + wait_ms * DEFER_JITTER))
        defer_current(broker, delay_ms=delay_ms, reason=outcome.reason)
    note_outcome(outcome.kind)  # after the copy is enqueued, so the copy does not carry it


@dramatiq.actor(actor_name=BUILD_REPORT.name, queue_name=BUILD_REPORT.queue)
def build_report(*args: Any, **kwargs: Any) -> None:
    job = ReportJob.parse(args, kwargs)
    _act_on(pipeline.run(worker.context, job))


@dramatiq.actor(actor_name=SEND_NOW.name, queue_name=SEND_NOW.queue)
def send_report_now(*args: Any, **kwargs: Any) -> None:
    job = SendNowJob.parse(args, kwargs)
    _act_on(pipeline.send_now(worker.context, job))
