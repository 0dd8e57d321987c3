"""Retention: delete what old periods left behind, keeping what is still needed.

:func:`prune` removes the per-user rows of periods older than the cut-off. On PostgreSQL, whose
per-user tables are partitioned by month (:mod:`reports.partitions`), a period goes in one
transaction that drops its partitions, one statement a table. On SQLite, or with ``batched``, it
deletes them by primary-key range, one transaction a batch, so it can stop and be run again. What
it keeps, and why: docs/howto/retention.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

import sqlalchemy
from sqlalchemy import Exists, Table, TableClause, and_, column, delete, exists, func, insert, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from reports import partitions
from reports.clock import utcnow
from reports.database import LOCK_NOT_AVAILABLE
from reports.fanout import runs
from reports.feedback import retention as feedback_retention
from reports.models import DeadLetter, Delivery, DeliveryState, ItemCount, Report, ReportItem, SendNowRequest
from reports.periods import Period
from reports.sql import after, rowcount

#: Rows deleted per transaction: each holds its locks only briefly (docs/benchmarks.md, "Pruning beside a running month").
BATCH_SIZE = 5_000

#: How long a drop waits for the locks on the partitioned tables, and how often it tries: it needs
#: them to itself for an instant, and gives way (to try again) rather than hold up every worker
#: behind it while a long transaction finishes. Below PostgreSQL's deadlock_timeout (1 s), so
#: that in a deadlock with a worker the drop is the one to give way.
LOCK_TIMEOUT_MS = 500
LOCK_ATTEMPTS = 20

#: How long a finished send-now request outlives its last use. It is what tells a copy of its
#: message still on its way (a retry, a deferral, a redelivery after a crash) that the email went
#: out: without it, the copy would send it again. A message's retries end within about a day.
SEND_NOW_KEPT = timedelta(days=7)

#: The per-user tables, in the order they are pruned, and how they are named to an operator.
_PER_USER: tuple[tuple[Table, str], ...] = (
    (cast(Table, Report.__table__), "reports"),
    (cast(Table, Delivery.__table__), "deliveries"),
    (cast(Table, ReportItem.__table__), "report items"),
)


def cutoff(now: datetime, months: int) -> Period:
    """The oldest period kept when keeping ``months`` months before the current one; older ones go.

    At any moment of December 2026 with 12 months, 2025-12 is kept and 2025-11 goes.
    """
    index = now.year * 12 + now.month - 1 - months
    return Period(index // 12, index % 12 + 1)


@dataclass
class PeriodPruned:
    period: str
    #: Rows deleted (or, in a dry run, that would be), by table as :data:`_PER_USER` names them.
    deleted: dict[str, int] = field(default_factory=dict)
    #: (period, user) pairs kept because an unreplayed dead letter refers to them.
    kept_for_dead_letters: int = 0
    #: True when a replay or a send-now made the period unfinished part-way: the rest was kept.
    reopened: bool = False
    #: True when other transactions kept the partitions' locks from a drop every time it tried:
    #: the period was left whole, for the next prune.
    busy: bool = False


@dataclass
class Pruned:
    periods: list[PeriodPruned] = field(default_factory=list)
    #: Old periods left whole because their run is unfinished.
    unfinished: list[str] = field(default_factory=list)
    #: False when ``should_stop`` ended the prune early: run it again to finish.
    finished: bool = True
    #: The provider feedback events pruned, once every old period is done.
    feedback: feedback_retention.Outcome | None = None

    @property
    def rows(self) -> int:
        return sum(sum(p.deleted.values()) for p in self.periods)


def _unreplayed_letter(table: TableClause) -> Exists:
    return exists().where(
        DeadLetter.period == table.c.period, DeadLetter.user_id == table.c.user_id, DeadLetter.replayed_at.is_(None)
    )


def old_periods(session: Session, before: Period) -> list[str]:
    """Every period before ``before`` that has per-user rows, oldest first.

    One index lookup per period and table (a loose index scan), not a scan of the rows.
    """
    found: set[str] = set()
    for table, _name in _PER_USER:
        last = ""
        while (
            period := session.scalar(
                select(func.min(table.c.period)).where(table.c.period > last, table.c.period < str(before))
            )
        ) is not None:
            found.add(period)
            last = period
    found.update(session.scalars(select(SendNowRequest.period).where(SendNowRequest.period < str(before)).distinct()))
    return sorted(found)


def prune(
    sessions: sessionmaker[Session],
    *,
    before: Period,
    batch_size: int = BATCH_SIZE,
    dry_run: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
    batched: bool = False,
    now: datetime | None = None,
    soft_bounce_window: timedelta = timedelta(0),
) -> Pruned:
    """Delete the per-user rows of periods before ``before`` (see the module's docstring), then
    the provider feedback events received before them and before ``soft_bounce_window``.

    :param dry_run: count what would go; change nothing.
    :param should_stop: asked between batches, or on PostgreSQL before each period's drop;
        ``True`` ends the prune there (resumable).
    :param batched: delete in batches on PostgreSQL too, as before the tables were partitioned
        (bench/prune.py compares the two).
    :param now: when the prune runs (send-now requests used since :data:`SEND_NOW_KEPT` are kept).
    """
    now = now or utcnow()
    settled_before = now - SEND_NOW_KEPT
    with sessions.begin() as session:
        partitions.keep_from_making(session)
        periods = old_periods(session, before)
        done = [period for period in periods if runs.finished(session, period)]
    result = Pruned(unfinished=[p for p in periods if p not in done])
    for period in done:
        pruned = PeriodPruned(period)
        result.periods.append(pruned)
        with sessions.begin() as session:
            pruned.kept_for_dead_letters = _kept(session, period)
        if dry_run:
            with sessions.begin() as session:
                partitions.keep_from_making(session)
                pruned.deleted = {name: _count(session, table, period) for table, name in _PER_USER}
                pruned.deleted["send-now requests"], pruned.deleted["replayed dead letters"] = _small_tables(
                    session, period, settled_before, dry_run=True
                )
        elif batched or not _partitioned(sessions):
            if not _prune_period(sessions, pruned, batch_size, should_stop, settled_before):
                result.finished = False
                return result
        elif should_stop() or not _drop_period(sessions, pruned, settled_before):
            result.finished = False
            return result
    # A month left whole (unfinished, or made so part-way) keeps the feedback about its emails too.
    kept_whole = [*result.unfinished, *(pruned.period for pruned in result.periods if pruned.reopened)]
    oldest_kept = min([before, *map(Period.parse, kept_whole)])
    result.feedback = feedback_retention.prune(
        sessions,
        before=feedback_retention.cutoff(oldest_kept, now, soft_bounce_window),
        batch_size=batch_size,
        dry_run=dry_run,
        should_stop=should_stop,
    )
    result.finished = result.feedback.finished
    return result


def _partitioned(sessions: sessionmaker[Session]) -> bool:
    with sessions() as session:
        return partitions.partitioned(session)


def _drop_period(sessions: sessionmaker[Session], pruned: PeriodPruned, settled_before: datetime) -> bool:
    """Drop one finished period's partitions, keeping the rows unreplayed dead letters need, in
    one transaction while the period stays finished; ``False`` when the locks could not be had."""
    for _attempt in range(LOCK_ATTEMPTS):
        try:
            with sessions.begin() as session:
                _drop_locked(session, pruned, settled_before)
            return True
        except OperationalError as error:
            if getattr(error.orig, "sqlstate", None) not in _GAVE_WAY:
                raise
            pruned.deleted = {}
    pruned.busy = True
    return False


#: The lock timeout, and deadlock_detected.
_GAVE_WAY = frozenset({LOCK_NOT_AVAILABLE, "40P01"})


def _drop_locked(session: Session, pruned: PeriodPruned, settled_before: datetime) -> None:
    period = pruned.period
    pruned.deleted = {name: 0 for _table, name in _PER_USER}
    if not _still_finished(session, period):
        pruned.reopened = True
        return
    # After the run's lock, as a send-now or a replay takes the run's and then makes partitions.
    partitions.keep_from_making(session)
    present = partitions.present(session, period)
    pruned.kept_for_dead_letters = _kept(session, period)
    # One user's rows per unreplayed dead letter, copied aside to be put back after the drop. In
    # the database, and before the drop: the drop locks the tables every worker writes until the
    # commit, and rows put back one by one from here held them for seconds at 12,000 letters.
    kept: dict[Table, TableClause] = {}
    for whole, name in _PER_USER:
        if whole.name in present:
            part = _columns_of(whole, partitions.name(whole.name, period))
            pruned.deleted[name] = _count(session, part, period)
            if pruned.kept_for_dead_letters:
                aside = _columns_of(whole, f"kept_{partitions.name(whole.name, period)}")
                session.execute(text(f"CREATE TEMPORARY TABLE {aside.name} (LIKE {whole.name}) ON COMMIT DROP"))
                session.execute(
                    insert(aside).from_select(list(aside.c), select(*part.c).where(_unreplayed_letter(part)))
                )
                if session.scalar(select(exists().select_from(aside))):
                    kept[whole] = aside
    # A period pruned before keeps only such rows: nothing to drop then.
    dropping = any(pruned.deleted.values())
    # Before the drop, which locks the tables every worker writes until the commit.
    pruned.deleted["send-now requests"], pruned.deleted["replayed dead letters"] = _small_tables(
        session, period, settled_before, dry_run=False
    )
    if dropping:
        _drop(session, period, present, kept)


def _columns_of(whole: Table, name: str) -> TableClause:
    """The table ``name`` with ``whole``'s columns: one of its partitions, or a copy of its rows."""
    return sqlalchemy.table(name, *(column(c.name, c.type) for c in whole.c))


def _drop(session: Session, period: str, present: list[str], kept: dict[Table, TableClause]) -> None:
    """Drop ``period``'s partitions, then put back the ``kept`` rows (copied aside) into new ones."""
    session.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
    # In the order a per-user message locks them, each with its parent table: a moment's lock.
    for name in partitions.PARTITIONED:
        if name in present:
            session.execute(text(f"DROP TABLE {partitions.name(name, period)}"))
    # The count triggers do not see a drop: the period's items went, and their counts with them.
    session.execute(delete(ItemCount).where(ItemCount.period == period))
    if kept:
        partitions.ensure(session, period)
        for whole, aside in kept.items():
            # The items are counted again by the insert's triggers: what a prune keeps, counts.
            session.execute(insert(whole).from_select([c.name for c in whole.c], select(*aside.c)))


def _prune_period(
    sessions: sessionmaker[Session],
    pruned: PeriodPruned,
    batch_size: int,
    should_stop: Callable[[], bool],
    settled_before: datetime,
) -> bool:
    """Delete one finished period's rows, batch by batch, while it stays finished; ``False`` when
    ``should_stop`` ended it."""
    period = pruned.period
    for table, name in _PER_USER:
        pruned.deleted[name] = 0
        for deleted in _delete_in_batches(sessions, table, period, batch_size):
            if deleted is None:
                pruned.reopened = True
                return True
            pruned.deleted[name] += deleted
            if should_stop():
                return False
    with sessions.begin() as session:
        if not _still_finished(session, period):
            pruned.reopened = True
            return True
        pruned.deleted["send-now requests"], pruned.deleted["replayed dead letters"] = _small_tables(
            session, period, settled_before, dry_run=False
        )
        session.execute(delete(ItemCount).where(ItemCount.period == period, ItemCount.n == 0))
    return True


def _still_finished(session: Session, period: str) -> bool:
    """Lock the period's run for this transaction, then check that it is still finished: a replay or
    a send-now committed before the lock is seen, and one that waits for it sees its rows kept."""
    return runs.finished(session, period, lock=True)


def _kept(session: Session, period: str) -> int:
    return (
        session.scalar(
            select(func.count(func.distinct(DeadLetter.user_id))).where(
                DeadLetter.period == period, DeadLetter.user_id.is_not(None), DeadLetter.replayed_at.is_(None)
            )
        )
        or 0
    )


def _count(session: Session, table: TableClause, period: str) -> int:
    return (
        session.scalar(
            select(func.count()).select_from(table).where(table.c.period == period, ~_unreplayed_letter(table))
        )
        or 0
    )


def _delete_in_batches(
    sessions: sessionmaker[Session], table: Table, period: str, batch_size: int
) -> Iterator[int | None]:
    """Delete the period's rows of ``table`` by ranges of user ids, one short transaction each,
    while the period is still finished; ``None``, and nothing more, once it is not."""
    last: int | None = None
    while True:
        with sessions.begin() as session:
            if not _still_finished(session, period):
                yield None
                return
            page = (
                select(table.c.user_id)
                .where(table.c.period == period, after(table.c.user_id, last))
                .order_by(table.c.user_id)
                .limit(batch_size)
                .subquery()
            )
            upto = session.scalar(select(func.max(page.c.user_id)))
            if upto is None:
                return
            deleted = rowcount(
                session.execute(
                    delete(table).where(
                        table.c.period == period,
                        after(table.c.user_id, last),
                        table.c.user_id <= upto,
                        ~_unreplayed_letter(table),
                    )
                )
            )
        last = upto
        yield deleted


def _small_tables(session: Session, period: str, settled_before: datetime, *, dry_run: bool) -> tuple[int, int]:
    """Send-now requests of ``period`` finished and unused since ``settled_before``, and its
    replayed dead letters: few rows, one statement each."""
    finished_requests = and_(
        SendNowRequest.period == period,
        SendNowRequest.state.in_((DeliveryState.SENT, DeliveryState.DEAD)),
        func.coalesce(SendNowRequest.updated_at, SendNowRequest.requested_at) < settled_before,
        ~exists().where(
            DeadLetter.period == period, DeadLetter.user_id == SendNowRequest.user_id, DeadLetter.replayed_at.is_(None)
        ),
    )
    replayed = and_(DeadLetter.period == period, DeadLetter.replayed_at.is_not(None))
    if dry_run:
        return (
            session.scalar(select(func.count()).select_from(SendNowRequest).where(finished_requests)) or 0,
            session.scalar(select(func.count()).select_from(DeadLetter).where(replayed)) or 0,
        )
    return (
        rowcount(session.execute(delete(SendNowRequest).where(finished_requests))),
        rowcount(session.execute(delete(DeadLetter).where(replayed))),
    )
