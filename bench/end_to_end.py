"""End to end: every user reported and mailed by two worker processes on PostgreSQL, against no queue.

Usage: .venv/bin/python bench/end_to_end.py [--users 40000] [--repeats 1] [--processes 2] [--threads 8]
                                            [--inactive-percent 0] [--timeout 3600]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server), a private redis-server and a local
SMTP sink in a process of its own (bench/smtp_sink.py), with --users users and their activities
seeded by `reports.ops.seed.seed` (what `reports seed --users N` runs) for last month:

1. queue: worker pools started as the Procfile does, `dramatiq actors --queues bulk --processes 2
   --threads 8` and the coordinator's `--queues default --processes 1 --threads 2`, booted before
   the clock starts. The period is triggered as `reports trigger` does (runs.trigger_and_enqueue);
   the clock stops when `reports.fanout.progress` (read every 0.25 s) says it is complete.
2. plain: the same period afresh (every table but the users' and activities' emptied), done by
   --processes plain multiprocessing processes of --threads threads each, no broker. The clock
   starts, the period is triggered (runs.trigger) and walked by the coordinator's own code
   (coordinator.walk_slice), which hands each page's jobs to the processes' threads through a
   multiprocessing queue (a pipe) instead of Redis; each thread runs `pipeline.run(context, job)`,
   what the build_report actor runs, with the context actors/runtime.py builds. The clock stops
   when every job has returned.

Each run prints its wall time, reports/s, the SMTP connections opened against the emails sent, the
PostgreSQL sessions opened, and checks that every active user got exactly one email (exit status 1
if not). With --repeats N the two alternate (queue first on odd repeats, plain first on even ones)
and their medians are compared; queue / plain wall time is the queue's overhead.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg
from smtp_sink import Delivered  # bench/smtp_sink.py, beside this script
from sqlalchemy.orm import Session, sessionmaker
from support import MailBench, Pools, interrupt_on_sigterm, mail_bench, settings_environ, watch_period

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.delivery import pipeline
from reports.fanout import coordinator, progress, runs
from reports.jobs import BUILD_REPORT, BULK_QUEUE, DEFAULT_QUEUE, ReportJob
from reports.worker.broker import build_broker

#: Tables a run leaves alone; every other one (runs, items and their counts, reports, deliveries…) is
#: emptied before each run, so every run does the same period from scratch.
SEEDED_TABLES = ("users", "activities", "alembic_version")
#: Seconds to wait for a plain process to start.
START_TIMEOUT = 60
#: Seconds between progress reads while the queue run goes on.
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Run:
    kind: str
    seconds: float
    #: Seconds from the start until the walk was planned (seen planned, for the queue run).
    planned_seconds: float | None
    delivered: int
    delivered_check: Delivered
    pg_sessions: int
    extra: str = ""

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds

    def describe(self, index: int) -> str:
        stats = self.delivered_check.stats
        planned = f"walk planned at {self.planned_seconds:.1f} s" if self.planned_seconds is not None else ""
        return (
            f"{self.kind:<5} #{index}: {self.delivered:,} reports in {self.seconds:.1f} s = {self.rate:,.0f} "
            f"reports/s ({planned}); SMTP: {stats['connections']:,} connections opened for "
            f"{stats['messages']:,} emails; PostgreSQL sessions opened: {self.pg_sessions:,}{self.extra}\n"
            f"         {self.delivered_check.describe()}"
        )


# --------------------------------------------------------------------------- the database between runs


def pg_sessions(url: str) -> int:
    """Sessions ever opened on the database (pg_stat_database; PostgreSQL 14+)."""
    time.sleep(1.0)  # backends report their statistics within about a second
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as connection:
        row = connection.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def empty_run_tables(url: str) -> None:
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as connection:
        tables = ", ".join(
            name
            for (name,) in connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND NOT tablename = ANY(%s)",
                (list(SEEDED_TABLES),),
            )
        )
        connection.execute(f"TRUNCATE {tables} RESTART IDENTITY")
        connection.execute(f"VACUUM ANALYZE {tables}")


def finish(
    kind: str,
    bench: MailBench,
    sessions: sessionmaker[Session],
    started: float,
    ended: float,
    planned_at: float | None,
    sessions_before: int,
    extra: str = "",
) -> Run:
    with sessions.begin() as session:
        final = progress.count(session, bench.period)
    if not final.complete or final.delivered != len(bench.active):
        raise RuntimeError(f"{kind} run ended with {final}, expected {len(bench.active):,} delivered")
    return Run(
        kind,
        ended - started,
        None if planned_at is None else planned_at - started,
        final.delivered,
        bench.sink.check(bench.active),
        pg_sessions(bench.settings.database_url) - sessions_before,
        extra,
    )


# --------------------------------------------------------------------------- 1. through the queue


def queue_run(args: argparse.Namespace, bench: MailBench, sessions: sessionmaker[Session]) -> Run:
    settings = bench.settings
    pools = Pools(bench.workdir, settings_environ(settings))
    try:
        pools.start("coordinator", DEFAULT_QUEUE, 1, 2)
        pools.start("bulk", BULK_QUEUE, args.processes, args.threads)
        broker = build_broker(settings)
        bench.sink.reset()
        before = pg_sessions(settings.database_url)
        started = time.monotonic()
        runs.trigger_and_enqueue(
            sessions, broker, bench.period, template_version=settings.template_version, now=utcnow()
        )
        _, planned_at = watch_period(
            sessions,
            bench.period,
            expected=len(bench.active),
            timeout=args.timeout,
            interval=POLL_SECONDS,
            alive=pools.check,
        )
        ended = time.monotonic()
        broker.close()
    finally:
        pools.stop_all()
    return finish("queue", bench, sessions, started, ended, planned_at, before)


# --------------------------------------------------------------------------- 2. plain processes, no queue


def plain_process(environ: dict[str, str], threads: int, jobs: Any, results: Any) -> None:
    """One plain process: ``threads`` threads take jobs from ``jobs`` and run them, as a worker's threads would."""
    os.environ.update(environ)
    from actors import runtime  # builds the same per-process context as a worker (actors/runtime.py)

    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def work() -> None:
        while (payload := jobs.get()) is not None:
            try:
                job = ReportJob.parse(
                    BUILD_REPORT.arguments(payload), {}
                )  # what the build_report actor does with its message
                outcome = str(pipeline.run(runtime.context, job))
            except Exception as error:  # noqa: BLE001  (counted and shown, like a worker would log it)
                outcome = f"error {type(error).__name__}: {error}"
            with lock:
                outcomes[outcome] += 1

    results.put(("ready", os.getpid()))
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put(("done", dict(outcomes)))


def plain_run(args: argparse.Namespace, bench: MailBench, sessions: sessionmaker[Session]) -> Run:
    settings, period = bench.settings, bench.period
    context = multiprocessing.get_context("spawn")
    results, jobs = context.Queue(), context.Queue()
    processes = [
        context.Process(
            target=plain_process, args=(settings_environ(settings), args.threads, jobs, results), daemon=True
        )
        for _ in range(args.processes)
    ]
    try:
        for process in processes:
            process.start()
        for _ in processes:
            results.get(timeout=START_TIMEOUT)
        bench.sink.reset()
        before = pg_sessions(settings.database_url)

        def hand_over(payloads: Any) -> int:
            sent = 0
            for payload in payloads:
                jobs.put(payload)
                sent += 1
            return sent

        started = time.monotonic()
        with sessions.begin() as session:
            runs.trigger(session, period, template_version=settings.template_version, now=utcnow())
        outcome = coordinator.SliceOutcome()
        while not outcome.planned:
            outcome = coordinator.walk_slice(
                sessions,
                period,
                hand_over,
                page_size=settings.plan_page_size,
                budget_seconds=settings.plan_slice_seconds,
            )
        planned_at = time.monotonic()
        for _ in range(args.processes * args.threads):
            jobs.put(None)
        outcomes: Counter[str] = Counter()
        done, deadline = 0, time.monotonic() + args.timeout
        while done < len(processes):
            try:
                _, counts = results.get(timeout=1)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in processes) or time.monotonic() > deadline:
                    raise RuntimeError("a plain process died or the run timed out") from None
                continue
            outcomes.update(counts)
            done += 1
        ended = time.monotonic()
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    others = {k: n for k, n in outcomes.items() if k != str(pipeline.Outcome.DELIVERED)}
    extra = f"; other outcomes: {others}" if others else ""
    return finish("plain", bench, sessions, started, ended, planned_at, before, extra)


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=40_000)
    parser.add_argument(
        "--inactive-percent",
        type=int,
        default=0,
        help="seeded users left inactive (reports seed's default is 10); 0: every user is mailed",
    )
    parser.add_argument("--repeats", type=int, default=1, help="queue and plain runs each, alternating")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (bulk pool) and plain processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per process, both kinds")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    args = parser.parse_args()
    interrupt_on_sigterm()

    failed = False
    with mail_bench(users=args.users, inactive_percent=args.inactive_percent, prefix="end-to-end-bench-") as bench:
        print(
            f"{args.processes} processes x {args.threads} threads; PostgreSQL, redis-server and the SMTP sink "
            f"on this machine",
            flush=True,
        )
        engine = create_db_engine(bench.settings.database_url)
        sessions = session_factory(engine)
        results: dict[str, list[Run]] = {"queue": [], "plain": []}
        for repeat in range(args.repeats):
            for kind in ("queue", "plain") if repeat % 2 == 0 else ("plain", "queue"):
                empty_run_tables(bench.settings.database_url)
                run = (queue_run if kind == "queue" else plain_run)(args, bench, sessions)
                results[kind].append(run)
                failed |= not run.delivered_check.ok
                print(run.describe(repeat + 1), flush=True)
        engine.dispose()
    queue = statistics.median(r.seconds for r in results["queue"])
    plain = statistics.median(r.seconds for r in results["plain"])
    label = "median " if args.repeats > 1 else ""
    users = len(bench.active)
    print(
        f"queue: {label}{queue:.1f} s = {users / queue:,.0f} reports/s; plain: {label}{plain:.1f} s "
        f"= {users / plain:,.0f} reports/s"
    )
    print(
        f"queue / plain wall time = {queue / plain:.3f}: the queue's overhead is {(queue / plain - 1):+.1%} "
        f"(target: within +10%)"
    )
    if failed:
        print("FAILED: not every user got exactly one email", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
