"""The plan a worker's connection keeps for recording a send, by when autovacuum first looked at the
month's `deliveries` partition: early, at a few dozen rows, or not yet.

Usage: python bench/first_look.py [--early 60] [--grown 30000] [--records 500]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server), --grown users are seeded and a
period is triggered and walked as `reports trigger` does. For each case, on fresh partitions: --early
claims are written, then --early sends are recorded on one connection of the workers' store
(`PostgresStore.record_sent`, prepared by the driver, so its plan is made here and kept); the
partition then grows to --grown claims, and --records more sends are recorded on the same
connection, then on a new one. The cases:

1. looked at early: ANALYZE at --early rows, as autovacuum does after 50 changes with its default
   thresholds;
2. not looked at yet: what the month's partitions' `autovacuum_*_threshold = 1000` keep until a
   thousand changes.

It prints the milliseconds each record took on the kept connection and on the new one.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from per_report import fresh_period  # bench/per_report.py, beside this script
from support import pg_connect, seed_users, temporary_database  # bench/support.py, beside this script

from reports import partitions
from reports.content.render import RenderedReport
from reports.database import create_db_engine, session_factory, upgrade
from reports.delivery import claims
from reports.delivery.store.port import StoredReport, Transaction
from reports.delivery.store.postgresql import PostgresStore
from reports.periods import Period
from reports.settings import Settings


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def add_claims(url: str, period: Period, users: list[int]) -> None:
    with pg_connect(url) as connection:
        connection.execute(
            f"INSERT INTO {partitions.name('deliveries', period)}"
            " SELECT %s, g, 'claimed', 'm' || g, 'token' || g, now() + interval '1 hour', 1, now()"
            " FROM unnest(%s::int[]) AS g",
            (str(period), users),
        )


def case(
    url: str, settings: Settings, period: Period, users: list[int], args: argparse.Namespace, *, early_look: bool
) -> tuple[float, float]:
    """Milliseconds a record on the connection kept from the start, then on a new one."""
    with pg_connect(url) as connection:
        for table in partitions.PARTITIONED:
            connection.execute(f"DROP TABLE IF EXISTS {partitions.name(table, period)}")
    engine = create_db_engine(url)
    fresh_period(session_factory(engine), period, settings)
    add_claims(url, period, users[: args.early])
    if early_look:
        with pg_connect(url) as connection:
            connection.execute(f"ANALYZE {partitions.name('deliveries', period)}")
    report = StoredReport("v2", RenderedReport(subject="s", text="t", html="<p>h</p>"), now())
    store = PostgresStore(engine)

    def record(transaction: Transaction, ids: list[int]) -> float:
        started = time.perf_counter()
        for user_id in ids:
            with transaction() as db:
                assert store.record_sent(db, claims.Claim(period, user_id, f"token{user_id}"), report, now=now())
        return 1000 * (time.perf_counter() - started) / len(ids)

    first, grown = users[: args.early], users[args.early : args.early + args.records]
    later = users[args.early + args.records : args.early + 2 * args.records]
    try:
        with store.transactions() as kept:
            record(kept, first)
            add_claims(url, period, users[args.early :])
            on_kept = record(kept, grown)
        engine.dispose()  # so that the next checkout opens a connection, which plans afresh
        with store.transactions() as new:
            on_new = record(new, later)
    finally:
        engine.dispose()
    return on_kept, on_new


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--early", type=int, default=60, help="rows when the plan is made")
    parser.add_argument("--grown", type=int, default=30_000, help="users, and rows the partition grows to")
    parser.add_argument("--records", type=int, default=500, help="sends recorded on each connection")
    args = parser.parse_args()
    period = Period.parse((now().replace(day=1) - timedelta(days=1)).strftime("%Y-%m"))
    with temporary_database() as url:
        settings = Settings(database_url=url)
        upgrade(settings)
        users = sorted(seed_users(url, users=args.grown, period=period, inactive_percent=0))
        assert len(users) >= args.early + 2 * args.records, "too few users for the records asked"
        print(f"recording a send, ms each, after the partition grew from {args.early:,} to {len(users):,} rows:")
        for label, early_look in (("looked at early (ANALYZE)", True), ("not looked at yet", False)):
            on_kept, on_new = case(url, settings, period, users, args, early_look=early_look)
            print(f"  {label:<26} kept connection {on_kept:6.2f}   new connection {on_new:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
