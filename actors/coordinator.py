"""The coordinator actor: walk a period's users in time-boxed slices."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from actors import queue, worker
from reports.fanout.coordinator import walk_slice
from reports.jobs import COORDINATOR, CoordinatorJob
from reports.worker.broker import WALKER_OPTION
from reports.worker.lifecycle import draining

logger = logging.getLogger(__name__)


@dramatiq.actor(actor_name=COORDINATOR.name, queue_name=COORDINATOR.queue)
def coordinator(*args: Any, **kwargs: Any) -> None:
    job = CoordinatorJob.parse(args, kwargs)
    message = CurrentMessage.get_current_message()
    # A message without a chain token (sent by an earlier release) starts a chain of its own.
    walker = (message.options.get(WALKER_OPTION) if message else None) or str(uuid.uuid4())
    outcome = walk_slice(
        worker.context.sessions,
        job.period,
        queue,
        walker=walker,
        page_size=worker.settings.plan_page_size,
        budget_seconds=worker.settings.plan_slice_seconds,
        # On SIGTERM, stop at the next page: the checkpoint and the continuation carry on.
        should_stop=draining.is_set,
        high_water=worker.settings.plan_high_water,
    )
    # A look that found nothing come due (one a minute while reports wait) is not news.
    idle = outcome.release_in is not None and not outcome.enqueued
    logger.log(
        logging.DEBUG if idle else logging.INFO,
        "Walked %d pages, enqueued %d reports for %s (cursor %s, planned=%s, chain %s%s).",
        outcome.pages,
        outcome.enqueued,
        job.period,
        outcome.cursor,
        outcome.planned,
        walker,
        ", superseded"
        if outcome.superseded
        else ", paused"
        if outcome.backlogged or outcome.settling
        else f", next look for due reports in {outcome.release_in:.0f} s"
        if outcome.release_in is not None
        else "",
    )
    delay = outcome.continue_in(pause_seconds=worker.settings.plan_pause_seconds)
    if delay is not None:
        queue.send_coordinator(walker, job.payload(), delay_ms=int(delay * 1000) or None)
