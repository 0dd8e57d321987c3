"""The dead-letter store: a work list of messages that failed for good, with their replay.

Every dead message lands here (the retry middleware's, and whatever Dramatiq put in its own
``.XQ`` keys, such as messages for an undefined actor), so there is one place to look.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from reports import items, partitions, pruning, suppressions
from reports.dead_message import DeadMessage
from reports.errors import InvalidPayload
from reports.jobs import BUILD_REPORT, COORDINATOR, SEND_NOW, CoordinatorJob, ReportJob, SendNowJob
from reports.models import (
    DeadLetter,
    DeadLetterReason,
    DeliveryState,
    ItemState,
    PeriodRun,
    ReportItem,
    SendNowRequest,
)
from reports.queue import Queue
from reports.sql import insert_ignoring_conflicts, rowcount

logger = logging.getLogger(__name__)

#: Dead letters replayed per transaction.
REPLAY_CHUNK = 500


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


_PARSERS: dict[str, Callable[[Sequence[Any], dict[str, Any]], ReportJob | CoordinatorJob | SendNowJob]] = {
    BUILD_REPORT.name: ReportJob.parse,
    SEND_NOW.name: SendNowJob.parse,
}


def _job(actor: str, args: Sequence[Any], kwargs: dict[str, Any]) -> ReportJob | CoordinatorJob | SendNowJob | None:
    """The job a dead payload describes, when it parses."""
    try:
        return _PARSERS.get(actor, CoordinatorJob.parse)(args, kwargs)
    except InvalidPayload:
        return None


def ids(dead: DeadMessage) -> dict[str, Any]:
    """The period and user a dead message was for, as far as its payload parses (for logs)."""
    job = _job(dead.actor, dead.args, dead.kwargs)
    if job is None:
        return {}
    return {"period": str(job.period), **({} if isinstance(job, CoordinatorJob) else {"user_id": job.user_id})}


def record(session: Session, dead: DeadMessage) -> bool:
    """Store ``dead`` and mark its report item ``dead``; ``False`` if it was stored already."""
    job = _job(dead.actor, dead.args, dead.kwargs)
    stored = session.execute(
        insert_ignoring_conflicts(session, DeadLetter.__table__)
        .values(
            message_id=dead.message_id,
            actor=dead.actor,
            queue=dead.queue,
            payload=json.dumps({"args": list(dead.args), "kwargs": dead.kwargs}, default=repr),
            period=str(job.period) if job else None,
            user_id=None if job is None or isinstance(job, CoordinatorJob) else job.user_id,
            attempts=dead.attempts,
            reason=dead.reason,
            error_class=dead.error_class,
            error_message=dead.error_message[:4000],
            traceback=dead.traceback,
            first_failed_at=_from_ms(dead.first_failed_ms),
            died_at=_from_ms(dead.died_ms),
        )
        .returning(DeadLetter.__table__.c.id)
    ).first()
    if stored is None:
        # Stored before, in a transaction that marked the item too. This is a copy of the same
        # message (redelivered after a crash before its ack): marking the item dead again would
        # undo a replay made since, and the replayed message would then find it final.
        return False
    if isinstance(job, ReportJob):
        items.finish(
            session,
            job.period,
            job.user_id,
            ItemState.DEAD,
            now=_from_ms(dead.died_ms),
            error=f"{dead.error_class}: {dead.error_message}",
        )
    elif isinstance(job, SendNowJob):
        # Dead, so reconcile does not send it again; a replay makes it requested once more.
        _set_request_state(session, job.request_id, DeliveryState.DEAD, unless=DeliveryState.SENT)
    return True


def _set_request_state(session: Session, request_id: str, state: DeliveryState, *, unless: DeliveryState) -> int:
    return rowcount(
        session.execute(
            update(SendNowRequest)
            .where(SendNowRequest.request_id == request_id, SendNowRequest.state != unless)
            .values(state=state)
            .execution_options(synchronize_session=False)
        )
    )


@dataclass(frozen=True)
class Filter:
    period: str | None = None
    #: Case-insensitive text to find in the reason, error class or error message.
    reason: str | None = None
    ids: tuple[int, ...] = ()
    include_replayed: bool = False
    #: Only this actor's (``build_report``, ``send_now`` …).
    actor: str | None = None
    #: Only those that died for this :class:`DeadLetterReason`.
    cause: str | None = None
    #: Only those with an id up to this one: the letters a count was shown for, none that died since.
    up_to_id: int | None = None

    def clauses(self) -> list[Any]:
        clauses: list[Any] = []
        if not self.include_replayed:
            clauses.append(DeadLetter.replayed_at.is_(None))
        if self.period:
            clauses.append(DeadLetter.period == self.period)
        if self.actor:
            clauses.append(DeadLetter.actor == self.actor)
        if self.cause:
            clauses.append(DeadLetter.reason == self.cause)
        if self.up_to_id is not None:
            clauses.append(DeadLetter.id <= self.up_to_id)
        if self.ids:
            clauses.append(DeadLetter.id.in_(self.ids))
        if self.reason:
            pattern = f"%{self.reason.lower()}%"
            clauses.append(
                or_(
                    *(
                        func.lower(c).like(pattern)
                        for c in (DeadLetter.reason, DeadLetter.error_class, DeadLetter.error_message)
                    )
                )
            )
        return clauses


#: Rows read at a time by :func:`find`.
FIND_PAGE = 1000


def find(session: Session, where: Filter, *, limit: int | None = None) -> Iterator[DeadLetter]:
    """The matching dead letters, oldest first, read a page at a time as they are used: a list of
    a million letters holds one page."""
    statement = (
        select(DeadLetter)
        .where(*where.clauses())
        .order_by(DeadLetter.id)
        .limit(limit)
        .execution_options(yield_per=FIND_PAGE)
    )
    yield from session.scalars(statement)


def page(session: Session, where: Filter, *, before: int | None, limit: int) -> list[DeadLetter]:
    """Up to ``limit`` matching dead letters, newest first, with an id below ``before`` when given:
    a keyset page, as cheap at the millionth letter as at the first."""
    statement = select(DeadLetter).where(*where.clauses())
    if before is not None:
        statement = statement.where(DeadLetter.id < before)
    return list(session.scalars(statement.order_by(DeadLetter.id.desc()).limit(limit)))


def count(session: Session, where: Filter) -> tuple[int, int]:
    """How many dead letters match, and the highest id among them (0 when none)."""
    n, highest = session.execute(select(func.count(), func.max(DeadLetter.id)).where(*where.clauses())).one()
    return int(n), int(highest or 0)


def get(session: Session, dead_letter_id: int) -> DeadLetter | None:
    return session.get(DeadLetter, dead_letter_id)


@dataclass
class Replayed:
    replayed: list[int] = field(default_factory=list)
    #: Report items set back to pending so progress shows them as in flight again.
    items_reset: int = 0
    #: Users of the letters replayed who are on the suppression list: their reports are skipped.
    suppressed: list[int] = field(default_factory=list)


def replay(sessions: sessionmaker[Session], queue: Queue, where: Filter, *, now: datetime, dry_run: bool) -> Replayed:
    """Enqueue each matching dead letter again, once, as a fresh message (attempts start over).

    The snapshot is bounded by the highest id when the replay starts: a message that dies again
    during the replay is a new dead letter and is not picked up by this one. A replayed report
    job goes through the same delivery claim as a first run, so a user already mailed is not
    mailed again. Each chunk holds off a prune of its periods, so a prune under way sees the
    items it resets pending and stops deleting their period.
    """
    outcome = Replayed()
    suppressed: set[int] = set()
    with sessions.begin() as session:
        ceiling = session.scalar(select(func.max(DeadLetter.id)).where(*where.clauses())) or 0
    for chunk in _chunks(sessions, where, ceiling):
        if not dry_run:
            _make_partitions(sessions, chunk)
        with sessions.begin() as session:
            # The periods' locks before the letters': a prune deletes replayed letters under its
            # period's lock, so both take them in this order and cannot deadlock.
            periods = select(DeadLetter.period).where(DeadLetter.id.in_(chunk), DeadLetter.period.is_not(None))
            pruning.hold_off(session, session.scalars(periods.distinct()))
            users: set[int] = set()
            for letter in session.scalars(select(DeadLetter).where(DeadLetter.id.in_(chunk)).with_for_update()):
                if letter.replayed_at is not None or letter.reason == DeadLetterReason.UNDECODABLE:
                    continue  # replayed concurrently by another operator, or no message to send
                outcome.replayed.append(letter.id)
                if letter.user_id is not None:
                    users.add(letter.user_id)
                if dry_run:
                    continue
                outcome.items_reset += _reset_item(session, letter, now)
                args, kwargs = _arguments(letter)
                message_id = queue.enqueue_again(
                    queue=letter.queue,
                    actor=letter.actor,
                    args=args,
                    kwargs=kwargs,
                    walker=_new_chain(session, letter, now),
                )
                letter.replayed_at, letter.replay_message_id = now, message_id
            suppressed |= suppressions.among(session, users)
    outcome.suppressed = sorted(suppressed)
    return outcome


def _arguments(letter: DeadLetter) -> tuple[list[Any], dict[str, Any]]:
    payload = json.loads(letter.payload)
    return payload["args"], payload["kwargs"]


def _chunks(sessions: sessionmaker[Session], where: Filter, ceiling: int) -> Iterator[list[int]]:
    after = 0
    while True:
        with sessions.begin() as session:
            ids = list(
                session.scalars(
                    select(DeadLetter.id)
                    .where(*where.clauses(), DeadLetter.id > after, DeadLetter.id <= ceiling)
                    .order_by(DeadLetter.id)
                    .limit(REPLAY_CHUNK)
                )
            )
        if not ids:
            return
        yield ids
        after = ids[-1]


def _new_chain(session: Session, letter: DeadLetter, now: datetime) -> str | None:
    """For a coordinator's letter, a new chain its run names (as reconcile starts one): a message
    of no chain the run names would find itself superseded and end at once."""
    if letter.actor != COORDINATOR.name:
        return None
    job = _job(letter.actor, *_arguments(letter))
    run = session.get(PeriodRun, str(job.period), with_for_update=True) if isinstance(job, CoordinatorJob) else None
    return None if run is None else run.new_chain(now)


def _make_partitions(sessions: sessionmaker[Session], chunk: list[int]) -> None:
    """Make the months the chunk's send-now letters write to, each in a short transaction of its
    own: making a month's partitions locks the tables every worker reads until the commit, and the
    chunk's transaction lasts while its letters go to the broker one by one."""
    with sessions() as session:
        letters = session.scalars(
            select(DeadLetter).where(
                DeadLetter.id.in_(chunk),
                DeadLetter.actor == SEND_NOW.name,
                DeadLetter.replayed_at.is_(None),
                DeadLetter.reason != DeadLetterReason.UNDECODABLE,
            )
        ).all()
        periods = sorted({str(job.period) for job in map(_send_now_job, letters) if job is not None})
    for period in periods:
        with sessions.begin() as session:
            partitions.ensure(session, period)


def _send_now_job(letter: DeadLetter) -> SendNowJob | None:
    job = _job(letter.actor, *_arguments(letter))
    return job if isinstance(job, SendNowJob) else None


def _reset_item(session: Session, letter: DeadLetter, now: datetime) -> int:
    if letter.actor == SEND_NOW.name:
        job = _send_now_job(letter)
        if job is not None:
            _set_request_state(session, job.request_id, DeliveryState.REQUESTED, unless=DeliveryState.SENT)
            # A prune may have dropped the month since (a send-now that died leaves no row to keep
            # it), and the message writes its report there: made before the chunk (one catalog
            # read here), or again if a prune dropped it since.
            partitions.ensure(session, job.period)
        return 0
    if letter.actor != BUILD_REPORT.name or letter.period is None or letter.user_id is None:
        return 0
    return rowcount(
        session.execute(
            update(ReportItem)
            .where(
                ReportItem.period == letter.period,
                ReportItem.user_id == letter.user_id,
                ReportItem.state == ItemState.DEAD,
            )
            .values(state=ItemState.PENDING, attempts=0, finished_at=None, last_error=None, updated_at=now)
            .execution_options(synchronize_session=False)
        )
    )


def purge(session: Session, *, older_than: timedelta, now: datetime) -> int:
    """Delete dead letters that died before ``now - older_than``; returns how many."""
    return rowcount(
        session.execute(
            delete(DeadLetter).where(DeadLetter.died_at < now - older_than).execution_options(synchronize_session=False)
        )
    )
