"""A month's partitions on PostgreSQL: made by whatever writes the month's first rows (a trigger, a
send-now request), once, however many processes do it at once; nothing of the kind on SQLite."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from reports import partitions
from reports.clock import utcnow
from reports.errors import BadInput
from reports.fanout import runs
from reports.fanout.coordinator import stamp_handed_out
from reports.models import ReportItem
from reports.ops import send_now
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import Broker
from tests.integration.test_retention import waiting_on_a_lock
from tests.support.databases import load_users
from tests.support.waiting import wait_until

PERIOD = Period.parse("2026-10")


def present(sessions: sessionmaker[Session], period: Period | str = PERIOD) -> list[str]:
    with sessions() as session:
        return partitions.present(session, period)


def trigger_once(sessions: sessionmaker[Session], ready: threading.Barrier) -> bool:
    with sessions.begin() as session:
        ready.wait(timeout=10)
        return runs.trigger(session, PERIOD, template_version="v1", now=utcnow()).created


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_triggers_of_a_new_month_at_once_make_its_partitions_once(sessions) -> None:
    assert present(sessions) == []
    ready = threading.Barrier(2)
    with ThreadPoolExecutor(max_workers=2) as pool:
        created = sorted(f.result(timeout=30) for f in [pool.submit(trigger_once, sessions, ready) for _ in range(2)])
    assert created == [False, True]
    assert present(sessions) == list(partitions.PARTITIONED)
    with sessions() as session:
        names = session.scalars(
            text("SELECT relname FROM pg_class WHERE relname LIKE '%\\_2026\\_10' AND relkind = 'r' ORDER BY 1")
        ).all()
    assert names == ["deliveries_2026_10", "report_items_2026_10", "reports_2026_10"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_second_process_making_the_same_partitions_waits_for_the_first_then_finds_them(sessions) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        with sessions.begin() as first:
            partitions.ensure(first, PERIOD)

            def second() -> list[str]:
                with sessions.begin() as session:
                    partitions.ensure(session, PERIOD)
                    return partitions.present(session, PERIOD)

            made = pool.submit(second)
            wait_until(lambda: waiting_on_a_lock(sessions), timeout=10, what="the second to wait for the first")
        assert made.result(timeout=10) == list(partitions.PARTITIONED)
    with sessions.begin() as session:
        session.add(
            ReportItem(
                period=str(PERIOD), user_id=1, state="pending", attempts=0, created_at=utcnow(), updated_at=utcnow()
            )
        )
        assert session.scalar(text("SELECT count(*) FROM report_items_2026_10")) == 1


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_handing_out_a_page_of_items_mostly_keeps_each_on_its_page(sessions) -> None:
    """The walk's stamp changes no indexed column, and the partition's free room keeps the new row
    on the item's page (HOT, no new index entry). On a page filled to the brim every row moves.

    The claim's update later needs the stamp's old copies pruned first, which waits for every older
    transaction on the server, other databases' too: not something a test on a shared server can
    count on, so only the stamp is checked here."""

    def pages() -> list[float]:
        with sessions() as session:
            return list(
                session.scalars(text("SELECT (ctid::text::point)[0] FROM report_items_2026_10 ORDER BY user_id"))
            )

    with sessions.begin() as session:
        partitions.ensure(session, PERIOD)
        session.execute(
            text(
                "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at)"
                " SELECT '2026-10', n, 'pending', 0, now(), now() FROM generate_series(1, 2000) AS n"
            )
        )
    written = pages()
    with sessions.begin() as session:  # handed out, as the walk stamps a page of items at once
        stamp_handed_out(session, PERIOD, 1, 2000, now=utcnow())
    # The stamp makes each row a little longer, so a page's last few rows may not fit beside it.
    assert sum(1 for before, after in zip(written, pages(), strict=True) if before != after) <= 2000 / 10


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_row_of_a_month_with_no_partition_is_refused(sessions) -> None:
    """No DEFAULT partition catches it: a path that forgot to make the month's partitions fails loudly."""
    with pytest.raises(IntegrityError, match="no partition of relation"), sessions.begin() as session:
        session.add(
            ReportItem(
                period="2026-09", user_id=1, state="pending", attempts=0, created_at=utcnow(), updated_at=utcnow()
            )
        )


def test_a_send_now_of_a_month_never_triggered_makes_its_partitions_and_a_refused_one_makes_none(
    sessions, broker: Broker, settings: Settings
) -> None:
    load_users(sessions, count=2, inactive_every=100)
    with pytest.raises(BadInput):
        send_now.request(sessions, broker, settings, 99, PERIOD, now=utcnow(), allow_untriggered=True)
    assert present(sessions) == []

    send_now.request(sessions, broker, settings, 1, PERIOD, now=utcnow(), allow_untriggered=True)

    on_postgresql = sessions.kw["bind"].dialect.name == "postgresql"
    assert present(sessions) == (list(partitions.PARTITIONED) if on_postgresql else [])
    with sessions() as session:
        assert session.scalars(select(ReportItem.period)).all() == []
