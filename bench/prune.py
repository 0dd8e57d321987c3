"""Prune a million rows of an old period on PostgreSQL while a stand-in worker writes a current one.

Usage: python bench/prune.py [--users 340000] [--threads 4] [--baseline-seconds 10]

Creates (and drops) a database of its own on TEST_POSTGRES_URL's server (default
postgresql://postgres@127.0.0.1:5432/postgres). An old period gets --users items, deliveries and
stored reports (three rows a user: 1,020,000 by default); a current, unfinished period gets
10,000 items. Stand-in workers (--threads) then do what a per-user message does to its rows, in a
loop: one transaction that locks a random current item, bumps it and upserts its report. It
prints the workers' transaction latency (p50, p99, max) for --baseline-seconds alone and then
while `reports.ops.retention.prune` deletes the old period, and the prune's rows per second.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from sqlalchemy import text
from support import temporary_database  # bench/support.py, beside this script

from reports.database import create_db_engine, session_factory, upgrade
from reports.ops import retention
from reports.periods import Period
from reports.settings import Settings

OLD, CURRENT = "2020-01", "2026-10"
CURRENT_ITEMS = 10_000

FILL = [
    (
        "INSERT INTO period_runs (period, state, template_version, cursor, planned, triggered_at, updated_at) "
        "VALUES (:old, 'active', 'v1', :users, true, now(), now()), (:current, 'active', 'v1', 0, false, now(), now())"
    ),
    (
        "INSERT INTO users (id, email, name, active) SELECT g, 'u' || g || '@example.test', 'User ' || g, true "
        "FROM generate_series(1, :users) g"
    ),
    (
        "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) "
        "SELECT :old, g, 'delivered', 1, now(), now() FROM generate_series(1, :users) g"
    ),
    (
        "INSERT INTO deliveries (period, user_id, state, message_id, claim_token, lease_expires_at, claims, claimed_at, "
        "sent_at) SELECT :old, g, 'sent', '<report.' || g || '>', 'token', now(), 1, now(), now() "
        "FROM generate_series(1, :users) g"
    ),
    (
        "INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at) "
        "SELECT :old, g, 'v1', 'Your report', repeat('text ', 40), repeat('<p>html</p>', 30), now() "
        "FROM generate_series(1, :users) g"
    ),
    (
        "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) "
        "SELECT :current, g, 'pending', 0, now(), now() FROM generate_series(1, :items) g"
    ),
]

WORK = [
    "SELECT state FROM report_items WHERE period = :p AND user_id = :u FOR UPDATE",
    "UPDATE report_items SET attempts = attempts + 1, updated_at = now() WHERE period = :p AND user_id = :u",
    (
        "INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at) "
        "VALUES (:p, :u, 'v1', 's', 't', 'h', now()) ON CONFLICT (period, user_id) DO UPDATE SET rendered_at = now()"
    ),
]


def _summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[int(len(ordered) * 0.99)]
    return (
        f"{len(ordered):,} transactions, p50 {statistics.median(ordered) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=340_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--baseline-seconds", type=float, default=10)
    arguments = parser.parse_args()
    with temporary_database() as url:
        settings = Settings(database_url=url)
        upgrade(settings)
        engine = create_db_engine(url)
        sessions = session_factory(engine)
        started = time.monotonic()
        with engine.begin() as connection:
            for statement in FILL:
                connection.execute(
                    text(statement), {"old": OLD, "current": CURRENT, "users": arguments.users, "items": CURRENT_ITEMS}
                )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM ANALYZE"))
        print(f"filled {arguments.users * 3:,} old rows in {time.monotonic() - started:.1f} s")

        phase = {"name": "before"}
        latencies: dict[str, list[float]] = {"before": [], "during": [], "after": []}
        stop = threading.Event()

        def work() -> None:
            rng = random.Random()
            while not stop.is_set():
                user_id = rng.randint(1, CURRENT_ITEMS)
                begun = time.perf_counter()
                with engine.begin() as connection:
                    for statement in WORK:
                        connection.execute(text(statement), {"p": CURRENT, "u": user_id})
                latencies[phase["name"]].append(time.perf_counter() - begun)

        workers = [threading.Thread(target=work) for _ in range(arguments.threads)]
        for worker in workers:
            worker.start()
        time.sleep(arguments.baseline_seconds)
        phase["name"] = "during"
        begun = time.monotonic()
        result = retention.prune(sessions, before=Period.parse("2021-01"))
        took = time.monotonic() - begun
        phase["name"] = "after"
        stop.set()
        for worker in workers:
            worker.join()
        engine.dispose()
    print(
        f"prune: {result.rows:,} rows in {took:.1f} s = {result.rows / took:,.0f} rows/s "
        f"({retention.BATCH_SIZE:,} a transaction)"
    )
    print(f"workers ({arguments.threads} threads) before the prune: {_summary(latencies['before'])}")
    print(f"workers during the prune:            {_summary(latencies['during'])}")


if __name__ == "__main__":
    main()
