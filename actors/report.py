"""The per-user actor: build, store and mail one report."""

from __future__ import annotations

import random
from typing import Any

import dramatiq

from actors import broker, runtime
from reports import pipeline
from reports.broker import defer_current
from reports.errors import ClaimHeld, PermanentError
from reports.jobs import BUILD_REPORT, ReportJob


@dramatiq.actor(actor_name=BUILD_REPORT.name, queue_name=BUILD_REPORT.queue, throws=(PermanentError,))
def build_report(*args: Any, **kwargs: Any) -> None:
    job = ReportJob.parse(args, kwargs)
    try:
        pipeline.run(runtime.context, job)
    except ClaimHeld as held:
        # Another copy is sending; look again when its lease ends, jittered so copies spread.
        defer_current(broker, delay_ms=int(held.retry_after_seconds * 1000) + random.randint(100, 1000))
