"""Time one `reports exporter` scrape against a period of a million report items on PostgreSQL.

Usage: python bench/exporter_scrape.py [--items 1000000] [--pending-percent 10] [--scrapes 15]

Creates (and drops) a database of its own on TEST_POSTGRES_URL's server (default
postgresql://postgres@127.0.0.1:5432/postgres), fills one period with items by plain SQL,
and prints the median and max time of a full collection (Redis and database) over the scrapes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from datetime import datetime

import psycopg
import redis
from support import temporary_database  # bench/support.py, beside this script

from reports import runs
from reports.database import create_db_engine, session_factory, upgrade
from reports.metrics import ReportsCollector
from reports.periods import Period
from reports.settings import Settings

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--pending-percent", type=int, default=10)
    parser.add_argument("--scrapes", type=int, default=15)
    args = parser.parse_args()

    with temporary_database() as url:
        measure(url, args)


def measure(url: str, args: argparse.Namespace) -> None:
    engine = None
    try:
        upgrade(Settings(database_url=url))
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as connection:
            started = time.perf_counter()
            connection.execute(
                "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) "
                "SELECT '2026-10', g, CASE WHEN g %% 100 < %s THEN 'pending' ELSE 'delivered' END, 1, now(), now() "
                "FROM generate_series(1, %s) g",
                (args.pending_percent, args.items),
            )
            connection.execute("VACUUM ANALYZE report_items")
            print(f"loaded {args.items:,} items ({args.pending_percent}% pending) in "
                  f"{time.perf_counter() - started:.1f} s")
        engine = create_db_engine(url)
        sessions = session_factory(engine)
        with sessions.begin() as session:
            runs.trigger(session, Period(2026, 10), template_version="v1", now=datetime.now())
        namespace = f"bench-{uuid.uuid4().hex[:8]}"
        collector = ReportsCollector(redis.Redis.from_url(REDIS_URL), namespace=namespace, sessions=sessions,
                                     queues=("critical", "default", "bulk"), breaker_name=f"{namespace}:breaker:mail")
        timings = []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            samples = sum(len(metric.samples) for metric in collector.collect())
            timings.append(time.perf_counter() - started)
        print(f"one scrape ({samples} samples, the period still pending so counted every time): "
              f"median {statistics.median(timings) * 1000:.1f} ms, max {max(timings) * 1000:.1f} ms "
              f"over {args.scrapes} scrapes")
    finally:
        if engine is not None:
            engine.dispose()


if __name__ == "__main__":
    main()
