"""A per-user statement finds its row by key, however the table has grown since it was planned.

Without statistics on ``report_items`` (before any ANALYZE: autovacuum off, as on this project's
machines, or not yet caught up with the coordinator's inserts), PostgreSQL priced "this user's
pending item" through the ``(period, state)`` index as cheap as through the primary key, chose
it, and read every pending entry of the period for each report; psycopg's prepared statements
then kept that plan for the connection's life. ``bench/worker_memory.py`` slowed from 85 to 49
reports/s over 200,000 users; a manual VACUUM ANALYZE, which threw the plan away, brought it to
123. Migration 0005 ended that index with ``user_id``, so either index finds the one entry; since
migration 0017 the index holds pending items alone, on ``(period, user_id)``, and still does.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from reports import items
from reports.clock import utcnow
from reports.models import ItemState
from tests.integration.conftest import PERIOD, make_partitions
from tests.support.waiting import wait_until

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

#: Executions on the empty table: past psycopg's prepare threshold (5) and PostgreSQL's five
#: custom plans before it considers a generic one.
WARM_UP = 20
ITEMS = 20_000
FINISHED = 50


def index_reads(sessions: sessionmaker[Session]) -> dict[str, tuple[int, int]]:
    """Index name → (scans, index entries read) on report_items (on PostgreSQL, on its months'
    partitions), as the statistics collector has them."""
    with sessions() as session:
        rows = session.execute(
            text(
                "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes WHERE relid IN"
                " (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'report_items'::regclass)"
            )
        ).all()
    return {name: (scans, read) for name, scans, read in rows}


def finish_each(sessions: sessionmaker[Session], user_ids: range) -> list[bool]:
    finished = []
    for user_id in user_ids:
        # One transaction per report, on the connection the pool hands back each time.
        with sessions.begin() as session:
            finished.append(items.finish(session, PERIOD, user_id, ItemState.DELIVERED, now=utcnow()))
    return finished


def test_finishing_an_item_reads_its_own_index_entry_after_the_table_grew_from_empty(sessions):
    make_partitions(sessions)
    assert finish_each(sessions, range(1, WARM_UP + 1)) == [False] * WARM_UP
    with sessions.begin() as session:
        session.execute(
            text(
                "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) "
                "SELECT :period, n, 'pending', 0, now(), now() FROM generate_series(1, :items) AS n"
            ),
            {"period": str(PERIOD), "items": ITEMS},
        )

    assert finish_each(sessions, range(1, FINISHED + 1)) == [True] * FINISHED

    # A backend reports its statistics when it ends.
    sessions.kw["bind"].dispose()
    wait_until(
        lambda: sum(scans for scans, _ in index_reads(sessions).values()) >= WARM_UP + FINISHED,
        timeout=10,
        what="the statistics of the finishing connection",
    )
    reads = index_reads(sessions)
    assert sum(read for _, read in reads.values()) <= 2 * FINISHED, reads
