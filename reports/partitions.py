"""The per-user tables' monthly partitions on PostgreSQL (migration 0014).

``report_items``, ``deliveries`` and ``reports`` are each partitioned by ``period``, one partition a
month, named ``report_items_2026_11`` and so on, so that a pruned month goes by dropping its three
partitions rather than by deleting its rows. There is no DEFAULT partition: a month's partitions
would then have to be carved out of it (a scan of it under lock, failing if it holds rows of that
month), and a month in it could not be dropped whole. Instead every path that writes a month's
first rows (a trigger, a send-now request) makes its partitions first, with :func:`ensure`.
On SQLite nothing here does anything: its tables are not partitioned.
"""

from __future__ import annotations

import re

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from reports.periods import Period

#: The partitioned tables, in the order their locks are taken: the order a per-user message
#: writes them in, so that a prune or a new month's partitions wait for messages, not deadlock with them.
PARTITIONED = ("report_items", "deliveries", "reports")

#: The advisory lock that makes partitions one process at a time: of two triggers of a new month,
#: the second waits for the first to commit and then finds its partitions made.
_LOCK = 0x70617274  # "part"

#: Changes to a month's partition before autovacuum first vacuums or analyzes it (migration 0018).
#: Its statistics decide the plan that each worker's prepared statements keep until the next look:
#: taken from a partition of a few dozen rows, as the first of a month sent at each user's morning
#: could be, that plan scans the whole partition for each message, and the partition grows to tens
#: of thousands of rows before autovacuum looks again. A partition never looked at is planned as
#: one of several pages, through its keys; from a thousand rows on, its statistics say the same.
FIRST_LOOK_AFTER = 1000

_FIRST_LOOK = f"autovacuum_vacuum_threshold = {FIRST_LOOK_AFTER}, autovacuum_analyze_threshold = {FIRST_LOOK_AFTER}"

#: Storage parameters of each table's partitions. An item's row is updated after it is written (handed
#: out, then claimed) with no indexed column changed: half of each page left free lets those updates
#: stay on the page (HOT), with no new entry in the item's four indexes (migration 0016).
STORAGE = {
    "report_items": f" WITH (fillfactor = 50, {_FIRST_LOOK})",
    "deliveries": f" WITH ({_FIRST_LOOK})",
    "reports": f" WITH ({_FIRST_LOOK})",
}

_NAME = re.compile(r"(report_items|deliveries|reports)_[0-9]{4}_[0-9]{2}")


def name(table: str, period: Period | str) -> str:
    """The partition of ``table`` that holds ``period``: ``report_items_2026_11``."""
    return f"{table}_{str(Period.parse(str(period))).replace('-', '_')}"


def is_partition(table_name: str) -> bool:
    """Whether a table of the database is one month's partition, not a table the models describe."""
    return _NAME.fullmatch(table_name) is not None


def partitioned(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def present(session: Session, period: Period | str) -> list[str]:
    """The tables of :data:`PARTITIONED` that have a partition for ``period`` (none on SQLite)."""
    if not partitioned(session):
        return []
    return [table for table in PARTITIONED if session.scalar(select(func.to_regclass(name(table, period)))) is not None]


def ensure(session: Session, period: Period | str) -> None:
    """Make ``period``'s missing partitions, in the caller's transaction: they exist once it
    commits. Costs one catalog read when they all exist, as they do after the month's first trigger.

    Creating a partition locks its parent table until the transaction ends: call it where the
    transaction commits soon.
    """
    if not partitioned(session) or present(session, period) == list(PARTITIONED):
        return
    keep_from_making(session)
    literal = str(Period.parse(str(period)))
    for table in PARTITIONED:
        session.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {name(table, period)} PARTITION OF {table} FOR VALUES IN ('{literal}')"
                + STORAGE[table]
            )
        )


def keep_from_making(session: Session) -> None:
    """Wait for a transaction making partitions (:func:`ensure`) to end, and keep any other from
    starting until this one ends: for a transaction that reads several of the partitioned tables.
    Making partitions locks their parent tables one after the other, in :data:`PARTITIONED`'s
    order; a reader that held one of them while waiting for another would deadlock with it."""
    if partitioned(session):
        session.execute(select(func.pg_advisory_xact_lock(_LOCK)))
