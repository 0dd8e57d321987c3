"""The per-user actor: build, store and mail one report."""

from __future__ import annotations

import random
from typing import Any

import dramatiq

from actors import broker, runtime
from reports import pipeline
from reports.broker import defer_current
from reports.errors import Deferred
from reports.jobs import BUILD_REPORT, ReportJob

#: Added to a deferral, as a fraction of its wait, so deferred copies do not return together.
DEFER_JITTER = 0.5


@dramatiq.actor(actor_name=BUILD_REPORT.name, queue_name=BUILD_REPORT.queue)
def build_report(*args: Any, **kwargs: Any) -> None:
    job = ReportJob.parse(args, kwargs)
    try:
        pipeline.run(runtime.context, job)
    except Deferred as deferred:
        # Another copy holds the claim, or the provider's breaker is open: come back later,
        # without spending a retry.
        wait_ms = deferred.retry_after_seconds * 1000
        defer_current(broker, delay_ms=int(wait_ms + random.uniform(100, 100 + wait_ms * DEFER_JITTER)))
