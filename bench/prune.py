"""Prune a million rows of an old period on PostgreSQL while stand-in workers write a current one:
by batched deletes before the tables were partitioned, then by dropping the month's partitions.

Usage: python bench/prune.py [--users 340000] [--threads 4] [--baseline-seconds 10]

Creates (and drops) a database of its own on TEST_POSTGRES_URL's server (default
postgresql://postgres@127.0.0.1:5432/postgres), at migration 0013 (the tables not partitioned).
Three old periods get --users items, deliveries and stored reports each (three rows a user:
1,020,000 a period by default); a current, unfinished period gets 10,000 items. Stand-in workers
(--threads) do what a per-user message does to its rows, in a loop: one transaction that locks a
random current item, bumps it and upserts its report. In one run it then prunes the first old
period by batched deletes (before), migrates to the newest schema (0014 partitions the tables; the
workers pause; then VACUUM ANALYZE, as after the fill), prunes the second by dropping its partitions (after), and the third by batched
deletes on the partitioned tables (``prune(batched=True)``). It prints each prune's time and rows
per second, the migration's seconds per million rows moved, and the workers' transaction latency
(p50, p99, max) alone and during each prune.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker
from support import temporary_database  # bench/support.py, beside this script

from reports import partitions
from reports.database import create_db_engine, session_factory, upgrade
from reports.ops import retention
from reports.periods import Period
from reports.settings import Settings

OLDS, CURRENT = ("2020-01", "2020-02", "2020-03"), "2026-10"
CURRENT_ITEMS = 10_000

SETUP = [
    (
        "INSERT INTO period_runs (period, state, template_version, cursor, planned, triggered_at, updated_at) "
        "VALUES (:current, 'active', 'v1', 0, false, now(), now())"
    ),
    (
        "INSERT INTO users (id, email, name, active) SELECT g, 'u' || g || '@example.test', 'User ' || g, true "
        "FROM generate_series(1, :users) g"
    ),
]

#: One old, finished period.
FILL = [
    (
        "INSERT INTO period_runs (period, state, template_version, cursor, planned, triggered_at, updated_at) "
        "VALUES (:old, 'active', 'v1', :users, true, now(), now())"
    ),
    (
        "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) "
        "SELECT :old, g, 'delivered', 1, now(), now() FROM generate_series(1, :users) g"
    ),
    (
        "INSERT INTO deliveries (period, user_id, state, message_id, claim_token, lease_expires_at, times_taken, "
        "claimed_at, sent_at) SELECT :old, g, 'sent', '<report.' || g || '>', 'token', now(), 1, now(), now() "
        "FROM generate_series(1, :users) g"
    ),
    (
        "INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at) "
        "SELECT :old, g, 'v1', 'Your report', repeat('text ', 40), repeat('<p>html</p>', 30), now() "
        "FROM generate_series(1, :users) g"
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


class Workers:
    """Stand-in workers on the current period, their latencies kept by the phase they fell in."""

    def __init__(self, engine: Engine, threads: int) -> None:
        self.engine, self.threads = engine, threads
        self.phase = "alone"
        self.latencies: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._running: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        self._running = [threading.Thread(target=self._work) for _ in range(self.threads)]
        for worker in self._running:
            worker.start()

    def stop(self) -> None:
        self._stop.set()
        for worker in self._running:
            worker.join()

    def _work(self) -> None:
        rng = random.Random()
        while not self._stop.is_set():
            user_id = rng.randint(1, CURRENT_ITEMS)
            begun = time.perf_counter()
            with self.engine.begin() as connection:
                for statement in WORK:
                    connection.execute(text(statement), {"p": CURRENT, "u": user_id})
            self.latencies.setdefault(self.phase, []).append(time.perf_counter() - begun)


def timed_prune(sessions: sessionmaker[Session], workers: Workers, old: str, how: str, *, batched: bool) -> str:
    workers.phase = how
    locked = LockHeld(sessions)
    begun = time.monotonic()
    result = retention.prune(sessions, before=Period.parse(old).next(), batched=batched)
    took = time.monotonic() - begun
    workers.phase = "after"
    locked.close()
    [pruned] = result.periods
    assert pruned.period == old and result.finished
    held = f"; the tables locked {locked.seconds * 1000:.0f} ms (first DROP to commit)" if locked.seconds else ""
    return f"prune {old}, {how}: {result.rows:,} rows in {took:.2f} s = {result.rows / took:,.0f} rows/s{held}"


class LockHeld:
    """How long a prune held its drop's locks: from its first ``DROP TABLE`` to the commit."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions, self.engine = sessions, sessions.kw["bind"]
        self.seconds = 0.0
        self._since: float | None = None
        event.listen(self.engine, "before_cursor_execute", self._statement)
        event.listen(sessions, "after_commit", self._commit)

    def _statement(self, _connection: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.startswith("DROP TABLE") and self._since is None:
            self._since = time.perf_counter()

    def _commit(self, _session: object) -> None:
        if self._since is not None:
            self.seconds += time.perf_counter() - self._since
            self._since = None

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._statement)
        event.remove(self.sessions, "after_commit", self._commit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=340_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--baseline-seconds", type=float, default=10)
    arguments = parser.parse_args()
    lines = []
    with temporary_database() as url:
        settings = Settings(database_url=url)
        upgrade(settings, "0013")
        engine = create_db_engine(url)
        sessions = session_factory(engine)
        started = time.monotonic()
        values = {"current": CURRENT, "users": arguments.users, "items": CURRENT_ITEMS}
        with engine.begin() as connection:
            for statement in SETUP:
                connection.execute(text(statement), values)
            for old in OLDS:
                for statement in FILL:
                    connection.execute(text(statement), {**values, "old": old})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM ANALYZE"))
        print(f"filled {arguments.users * 3 * len(OLDS):,} old rows in {time.monotonic() - started:.1f} s")

        workers = Workers(engine, arguments.threads)
        workers.start()
        time.sleep(arguments.baseline_seconds)
        lines.append(timed_prune(sessions, workers, OLDS[0], "batched deletes, tables not partitioned", batched=True))
        workers.stop()
        engine.dispose()
        with engine.connect() as connection:
            moved = sum(
                connection.scalar(text(f"SELECT count(*) FROM {table}")) or 0 for table in partitions.PARTITIONED
            )
        begun = time.monotonic()
        upgrade(settings)
        took = time.monotonic() - begun
        lines.append(f"migration 0014: {moved:,} rows moved in {took:.1f} s = {took / moved * 1e6:.1f} s per million")
        # As the fill was before the first prune: an old month has long been vacuumed.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM ANALYZE"))
        workers.start()
        time.sleep(arguments.baseline_seconds / 2)
        lines.append(timed_prune(sessions, workers, OLDS[1], "partitions dropped", batched=False))
        time.sleep(arguments.baseline_seconds / 2)
        lines.append(timed_prune(sessions, workers, OLDS[2], "batched deletes, tables partitioned", batched=True))
        workers.stop()
        engine.dispose()
    for line in lines:
        print(line)
    print(f"workers ({arguments.threads} threads), {'phase':<40} transactions, latency")
    for phase, latencies in workers.latencies.items():
        print(f"  {phase:<48} {_summary(latencies)}")


if __name__ == "__main__":
    main()
