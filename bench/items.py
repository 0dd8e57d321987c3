"""A period of a million report items on PostgreSQL, for the benchmarks that read a whole period.

`bench/exporter_scrape.py` and `bench/progress.py` fill it the same way: plain SQL over
``generate_series`` (seconds, where the coordinator would take minutes), the states spread over
the user ids by ``id % 100``, then ``VACUUM ANALYZE`` so the planner sees what a long-running
database would have, and the period triggered as ``reports trigger`` records it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from support import pg_connect  # bench/support.py, beside this file

from reports import partitions
from reports.database import create_db_engine, session_factory, upgrade
from reports.fanout import runs
from reports.models import ItemState, PeriodRun
from reports.periods import Period
from reports.settings import Settings

PERIOD = Period(2026, 10)


@contextlib.contextmanager
def period_of_items(
    url: str, *, items: int, percent: Mapping[ItemState, int], planned: bool = False
) -> Iterator[sessionmaker[Session]]:
    """Migrate the empty database at ``url`` and fill :data:`PERIOD` with ``items`` items; yield sessions on it.

    ``percent`` gives a state's share of the items in whole percent; the rest are delivered.
    ``planned`` marks the coordinator's walk as done. The engine is disposed of after.
    """
    if sum(percent.values()) > 100 or ItemState.DELIVERED in percent:
        raise ValueError(f"Shares of the states other than delivered, at most 100 % in all: {dict(percent)}")
    upgrade(Settings(database_url=url))
    engine = create_db_engine(url)
    try:
        sessions = session_factory(engine)
        # The month's partitions first, as its trigger would make them: the items are loaded before it.
        with sessions.begin() as session:
            partitions.ensure(session, PERIOD)
        with pg_connect(url) as connection:
            started = time.perf_counter()
            cases, bound, parameters = [], 0, []
            for state, share in percent.items():
                bound += share
                cases.append("WHEN g %% 100 < %s THEN %s")
                parameters += [bound, str(state)]
            connection.execute(
                "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) "
                f"SELECT %s, g, CASE {' '.join(cases)} ELSE 'delivered' END, 1, now(), now() "
                "FROM generate_series(1, %s) g",
                (str(PERIOD), *parameters, items),
            )
            connection.execute("VACUUM ANALYZE report_items")
            mix = ", ".join(f"{share}% {state}" for state, share in percent.items())
            print(f"loaded {items:,} items ({mix}) in {time.perf_counter() - started:.1f} s")
        with sessions.begin() as session:
            runs.trigger(session, PERIOD, template_version="v1", now=datetime.now())
            if planned:
                session.execute(update(PeriodRun).where(PeriodRun.period == str(PERIOD)).values(planned=True))
        yield sessions
    finally:
        engine.dispose()
