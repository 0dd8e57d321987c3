"""Send one user's report for a period now, on the critical queue: what ``reports send-now`` and the
console's button do."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from reports import partitions, pruning
from reports.delivery import claims
from reports.delivery.mail.compose import message_id
from reports.errors import BadInput, SendNowNotEnqueued
from reports.jobs import SEND_NOW, SendNowJob
from reports.models import PeriodRun, User
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import Broker, send


def request(
    sessions: sessionmaker[Session],
    broker: Broker,
    settings: Settings,
    user_id: int,
    period: Period,
    *,
    now: datetime,
    include_inactive: bool = False,
    allow_untriggered: bool = False,
) -> SendNowJob:
    """Record a send-now request and enqueue its message; :class:`BadInput` (nothing recorded) for
    an unknown user, a deactivated one unless ``include_inactive``, or a period never triggered
    unless ``allow_untriggered``."""
    request_id = str(uuid.uuid4())
    with sessions.begin() as session:
        user = session.get(User, user_id)
        if user is None:
            raise BadInput(f"No user with id {user_id}.")
        if not user.active and not include_inactive:
            raise BadInput(f"User {user_id} is deactivated; pass --include-inactive to send anyway.")
        # Held until the request is committed, so a prune of the period under way sees it.
        pruning.hold_off(session, [str(period)])
        run = session.get(PeriodRun, str(period))
        if run is None and not allow_untriggered:
            raise BadInput(
                f"Period {period} has never been triggered; pass --allow-untriggered to send its report anyway."
            )
        # Its message writes the period's delivery and report: a period with no run has no partitions yet.
        partitions.ensure(session, period)
        job = SendNowJob(
            period, user_id, request_id, run.template_version if run is not None else settings.template_version
        )
        # Written before the message exists: if Redis loses it, reconcile sends the request again.
        claims.record_send_now_request(
            session,
            request_id,
            period,
            user_id,
            template_version=job.template_version,
            message_id=message_id(period, user_id, settings.mail_domain, request_id=request_id),
            now=now,
        )
    try:
        send(broker, SEND_NOW, job.payload())
    # Whatever the broker raises (Redis's, RabbitMQ's and SQS's clients each have their own): the
    # request is recorded, and one asked again would be a second email.
    except Exception as error:
        raise SendNowNotEnqueued(
            f"Send-now request {request_id} (user {user_id}, {period}) is recorded, but the broker did not take its "
            f"message ({type(error).__name__}). Reconcile sends it once the broker is back (the scheduler's, or "
            f"`reports reconcile {period}`); do not request it again, which would mail the user a second time."
        ) from error
    return job
