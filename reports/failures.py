"""Dramatiq middleware: a per-user message that has failed for good marks its item ``dead``.

Without it a permanently failing user would stay ``pending`` and the period would never
complete. It must sit before ``Retries`` in the middleware list: ``after_*`` hooks run in
reverse order, and only after ``Retries`` has run is ``message.failed`` final.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware
from sqlalchemy.orm import Session, sessionmaker

from reports import items
from reports.clock import utcnow
from reports.errors import InvalidPayload
from reports.jobs import BUILD_REPORT, ReportJob
from reports.models import ItemState

logger = logging.getLogger(__name__)


class FailedItems(Middleware):
    def __init__(self, sessions: Callable[[], sessionmaker[Session]]) -> None:
        self._sessions = sessions

    def after_process_message(
        self, broker: dramatiq.Broker, message: dramatiq.Message[Any], *, result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is None or not message.failed or message.actor_name != BUILD_REPORT.name:
            return
        error = f"{type(exception).__name__}: {exception}"
        try:
            job = ReportJob.parse(message.args, message.kwargs)
        except InvalidPayload:
            logger.error("Malformed report message failed.", extra={"message_id": message.message_id})
            return
        with self._sessions().begin() as session:
            items.finish(session, job.period, job.user_id, ItemState.DEAD, now=utcnow(), error=error)
        logger.error(
            "Report item is dead.",
            extra={"message_id": message.message_id, "period": str(job.period), "user_id": job.user_id},
        )
