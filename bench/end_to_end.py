"""End to end: every user reported and mailed by two worker processes on PostgreSQL, against no queue.

Usage: .venv/bin/python bench/end_to_end.py [--users 40000] [--repeats 1] [--processes 2] [--threads 8]
                                            [--inactive-percent 0] [--timeout 3600]
                                            [--broker redis|rabbitmq|sqs|both] [--rabbitmq-url URL]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server), a private redis-server and a local
SMTP sink in a process of its own (bench/smtp_sink.py), with --users users and their activities
seeded by `reports.ops.seed.seed` (what `reports seed --users N` runs) for last month:

1. queue: worker pools started as the Procfile does, `dramatiq actors --queues bulk --processes 2
   --threads 8` and the coordinator's `--queues default --processes 1 --threads 2`, booted before
   the clock starts. The period is triggered as `reports trigger` does (runs.trigger_and_enqueue);
   the clock stops when `reports.fanout.progress` (read every 0.25 s) says it is complete. This is
   done for each broker of --broker (default redis): on Redis the private redis-server is the broker;
   on RabbitMQ the broker is a vhost `bench-<hex>` of the run's own on this machine's node (made with
   rabbitmqctl before the pools boot, deleted after, Ctrl-C included) and the redis-server holds only
   the shared state (REDIS_URL), as in production. On SQS (`--broker sqs`, not in `both`) the broker
   is moto's server (tests/support/sqs.py) in this process, a fresh one per run: its figures are
   moto's speed, not SQS's, and have no target; the run also prints the SQS requests it made, by
   action and per report, and what they cost per million reports at SQS_PRICE_PER_MILLION.
2. plain: the same period afresh (every table but the users' and activities' emptied), done by
   --processes plain multiprocessing processes of --threads threads each, no broker. The clock
   starts, the period is triggered (runs.trigger) and walked by the coordinator's own code
   (coordinator.walk_slice), which hands each page's jobs to the processes' threads through a
   multiprocessing queue (a pipe) instead of Redis; each thread runs `pipeline.run(context, job)`,
   what the build_report actor runs, with the context actors/process.py builds. The clock stops
   when every job has returned.

Each run prints its wall time, reports/s, the SMTP connections opened against the emails sent, the
PostgreSQL sessions opened and PostgreSQL's CPU per report (every process of TEST_POSTGRES_URL's
server, when it runs on this machine, with the backends that exited meanwhile: the whole server's,
so other databases' work on it is counted too, but not another server's; on a shared machine, give
the bench a server of its own), and checks that every active user got exactly one email (exit status 1
if not). With --repeats N the kinds alternate (redis, rabbitmq, plain on odd repeats, the reverse
on even ones) and a table compares their medians; each queue's wall time over plain's is its
overhead. Redis is emptied before every run, so no run inherits another's shared state.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import redis
from smtp_sink import Delivered  # bench/smtp_sink.py, beside this script
from sqlalchemy.orm import Session, sessionmaker
from support import (
    RABBITMQ_URL,
    MailBench,
    Pools,
    Vhosts,
    interrupt_on_sigterm,
    mail_bench,
    postgres_cpu_seconds,
    settings_environ,
    watch_period,
)

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.delivery import pipeline
from reports.fanout import coordinator, progress, runs
from reports.jobs import BUILD_REPORT, BULK_QUEUE, DEFAULT_QUEUE, ActorSpec, ReportJob
from reports.queue import InMemoryQueue
from reports.settings import Settings
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for
from tests.support import sqs as moto

#: Tables a run leaves alone; every other one (runs, items and their counts, reports, deliveries…) is
#: emptied before each run, so every run does the same period from scratch.
SEEDED_TABLES = ("users", "activities", "alembic_version")
#: Seconds to wait for a plain process to start.
START_TIMEOUT = 60
#: Seconds between progress reads while the queue run goes on.
POLL_SECONDS = 0.25
#: The brokers a queue run can go through; ``both`` is the first two (SQS runs on moto: see the module).
BROKERS = ("redis", "rabbitmq", "sqs")
#: What SQS charges per million requests (a standard queue, after the free tier; AWS's published
#: price in us-east-1 when this was written), in US dollars.
SQS_PRICE_PER_MILLION = 0.40


@dataclass(frozen=True)
class Run:
    kind: str
    seconds: float
    #: Seconds from the start until the walk was planned (seen planned, for the queue run).
    planned_seconds: float | None
    delivered: int
    delivered_check: Delivered
    pg_sessions: int
    #: CPU seconds PostgreSQL used during the run; ``None`` for a server on another machine.
    pg_cpu_seconds: float | None = None
    extra: str = ""

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds

    @property
    def pg_cpu_ms_per_report(self) -> float | None:
        return None if self.pg_cpu_seconds is None else 1000 * self.pg_cpu_seconds / self.delivered

    def describe(self, index: int) -> str:
        stats = self.delivered_check.stats
        planned = f"walk planned at {self.planned_seconds:.1f} s" if self.planned_seconds is not None else ""
        pg_cpu = self.pg_cpu_ms_per_report
        cpu = "" if pg_cpu is None else f"; PostgreSQL CPU {pg_cpu:.2f} ms per report"
        return (
            f"{self.kind:<8} #{index}: {self.delivered:,} reports in {self.seconds:.1f} s = {self.rate:,.0f} "
            f"reports/s ({planned}); SMTP: {stats['connections']:,} connections opened for "
            f"{stats['messages']:,} emails; PostgreSQL sessions opened: {self.pg_sessions:,}{cpu}{self.extra}\n"
            f"            {self.delivered_check.describe()}"
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
    pg_cpu_seconds: float | None,
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
        pg_cpu_seconds,
        extra,
    )


# --------------------------------------------------------------------------- 1. through the queue


def queue_run(
    args: argparse.Namespace, bench: MailBench, sessions: sessionmaker[Session], kind: str, vhosts: Vhosts | None
) -> Run:
    """One period through worker pools on the broker ``kind`` names (a fresh vhost when it is RabbitMQ)."""
    if kind == "sqs":
        return sqs_run(args, bench, sessions)
    vhost = None
    try:
        if kind == "rabbitmq":
            assert vhosts is not None
            vhost, vhost_url = vhosts.create()
            # The bench's redis-server stays the fleet's shared state (breaker, send rate, metrics).
            settings = dataclasses.replace(bench.settings, broker_url=vhost_url, redis_url=bench.settings.broker_url)
        else:
            settings = bench.settings
        return _queue_run(args, bench, sessions, kind, settings)
    finally:
        if vhost is not None and vhosts is not None:
            vhosts.delete(vhost)


def sqs_run(args: argparse.Namespace, bench: MailBench, sessions: sessionmaker[Session]) -> Run:
    """One period through worker pools on moto's SQS, a fresh server; with the requests the run made."""
    requests: Counter[str] = Counter()
    os.environ.update(moto.CREDENTIALS)
    with moto.moto_server(requests) as endpoint, moto.temporary_prefix(endpoint) as url:
        settings = dataclasses.replace(bench.settings, broker_url=url, redis_url=bench.settings.broker_url)
        return _queue_run(args, bench, sessions, "sqs", settings, requests)


def _requests_per_report(requests: Counter[str], reports: int) -> str:
    total = sum(requests.values())
    actions = ", ".join(f"{action} {n / reports:.2f}" for action, n in requests.most_common())
    cost = SQS_PRICE_PER_MILLION * total / reports
    return (
        f"\n            SQS requests: {total:,} = {total / reports:.2f} per report ({actions}); at "
        f"${SQS_PRICE_PER_MILLION:.2f} per million requests, ${cost:.2f} per million reports"
    )


def _queue_run(
    args: argparse.Namespace,
    bench: MailBench,
    sessions: sessionmaker[Session],
    kind: str,
    settings: Settings,
    requests: Counter[str] | None = None,
) -> Run:
    """:param requests: the broker's requests as its server counts them (SQS on moto), read from the
    trigger to the end of the run."""
    pools = Pools(bench.workdir, settings_environ(settings))
    try:
        pools.start(f"{kind}-coordinator", DEFAULT_QUEUE, 1, 2)
        pools.start(f"{kind}-bulk", BULK_QUEUE, args.processes, args.threads)
        broker = build_broker(settings)
        bench.sink.reset()
        before = pg_sessions(settings.database_url)
        cpu_before = postgres_cpu_seconds(settings.database_url)
        requests_before = Counter(requests)
        started = time.monotonic()
        runs.trigger_and_enqueue(
            sessions, queue_for(broker), bench.period, template_version=settings.template_version, now=utcnow()
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
        spent = Counter(requests) - requests_before
        pg_cpu = _spent(cpu_before, postgres_cpu_seconds(settings.database_url))
        broker.close()
    finally:
        pools.stop_all()
    extra = _requests_per_report(spent, len(bench.active)) if requests is not None else ""
    return finish(kind, bench, sessions, started, ended, planned_at, before, pg_cpu, extra)


# --------------------------------------------------------------------------- 2. plain processes, no queue


def plain_process(environ: dict[str, str], threads: int, jobs: Any, results: Any) -> None:
    """One plain process: ``threads`` threads take jobs from ``jobs`` and run them, as a worker's threads would."""
    os.environ.update(environ)
    from actors import worker  # builds the same per-process context as a worker (actors/process.py)

    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def work() -> None:
        while (payload := jobs.get()) is not None:
            try:
                job = ReportJob.parse(
                    BUILD_REPORT.arguments(payload), {}
                )  # what the build_report actor does with its message
                outcome = str(pipeline.run(worker.context, job))
            except Exception as error:  # noqa: BLE001  (counted and shown, like a worker would log it)
                outcome = f"error {type(error).__name__}: {error}"
            with lock:
                outcomes[outcome] += 1

    results.put(("ready", os.getpid()))
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
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
        cpu_before = postgres_cpu_seconds(settings.database_url)

        class HandingOver(InMemoryQueue):
            def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
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
                HandingOver(),
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
        pg_cpu = _spent(cpu_before, postgres_cpu_seconds(settings.database_url))
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    others = {k: n for k, n in outcomes.items() if k != str(pipeline.Outcome.DELIVERED)}
    extra = f"; other outcomes: {others}" if others else ""
    return finish("plain", bench, sessions, started, ended, planned_at, before, pg_cpu, extra)


def _spent(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


# --------------------------------------------------------------------------- main


def _median_cpu(kind_runs: list[Run]) -> str:
    figures = [cpu for r in kind_runs if (cpu := r.pg_cpu_ms_per_report) is not None]
    return f"{statistics.median(figures):.2f}" if figures else "n/a"


def table(results: dict[str, list[Run]], users: int) -> None:
    """Each kind's median wall time and rate, its ratio to plain, and whether every user got one email."""
    label = "median " if max(len(runs) for runs in results.values()) > 1 else ""
    plain = statistics.median(r.seconds for r in results["plain"])
    header = [
        "run",
        f"{label}seconds",
        "reports/s",
        "/ plain",
        "each run's seconds",
        "PostgreSQL CPU ms/report",
        "every user one email",
    ]
    rows = [header]
    for kind, kind_runs in results.items():
        seconds = statistics.median(r.seconds for r in kind_runs)
        rows.append(
            [
                kind,
                f"{seconds:.1f}",
                f"{users / seconds:,.0f}",
                "-" if kind == "plain" else f"{seconds / plain:.3f}",
                " ".join(f"{r.seconds:.1f}" for r in kind_runs),
                _median_cpu(kind_runs),
                "yes" if all(r.delivered_check.ok for r in kind_runs) else "NO",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print()
    for i, cells in enumerate(rows):
        print(
            "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths, strict=True)))
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))
    if "redis" in results and "rabbitmq" in results:
        redis_s = statistics.median(r.seconds for r in results["redis"])
        rabbitmq_s = statistics.median(r.seconds for r in results["rabbitmq"])
        print(f"rabbitmq / redis wall time = {rabbitmq_s / redis_s:.3f}")
    print("target for a queue / plain: within +10% (1.10); none for sqs, which runs on moto")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=40_000)
    parser.add_argument(
        "--inactive-percent",
        type=int,
        default=0,
        help="seeded users left inactive (reports seed's default is 10); 0: every user is mailed",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each kind, alternating")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (bulk pool) and plain processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per process, both kinds")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    # Redis by default: the benchmarks' earlier rows were measured without RabbitMQ, which not every machine runs.
    parser.add_argument(
        "--broker",
        choices=(*BROKERS, "both"),
        default="redis",
        help="the queue runs' broker(s); both: redis and rabbitmq",
    )
    parser.add_argument(
        "--rabbitmq-url",
        default=RABBITMQ_URL,
        help="this machine's RabbitMQ node, which the bench makes its vhosts on (default BENCH_RABBITMQ_URL or "
        "amqp://guest:guest@127.0.0.1:5672/)",
    )
    args = parser.parse_args()
    interrupt_on_sigterm()
    brokers = BROKERS[:2] if args.broker == "both" else (args.broker,)
    vhosts = Vhosts(args.rabbitmq_url) if "rabbitmq" in brokers else None
    rabbitmq = ""
    if vhosts is not None:
        try:
            rabbitmq = f", RabbitMQ {vhosts.check()} (a vhost of each run's own)"
        except RuntimeError as error:
            parser.error(f"{error} (--broker redis leaves RabbitMQ out)")

    failed = False
    kinds = (*brokers, "plain")
    results: dict[str, list[Run]] = {kind: [] for kind in kinds}
    try:
        with mail_bench(users=args.users, inactive_percent=args.inactive_percent, prefix="end-to-end-bench-") as bench:
            print(
                f"{args.processes} processes x {args.threads} threads; PostgreSQL, redis-server{rabbitmq} and the "
                f"SMTP sink on this machine",
                flush=True,
            )
            engine = create_db_engine(bench.settings.database_url)
            sessions = session_factory(engine)
            shared = redis.Redis.from_url(bench.settings.broker_url)
            for repeat in range(args.repeats):
                for kind in kinds if repeat % 2 == 0 else kinds[::-1]:
                    empty_run_tables(bench.settings.database_url)
                    shared.flushall()
                    if kind == "plain":
                        run = plain_run(args, bench, sessions)
                    else:
                        run = queue_run(args, bench, sessions, kind, vhosts)
                    results[kind].append(run)
                    failed |= not run.delivered_check.ok
                    print(run.describe(repeat + 1), flush=True)
            shared.close()
            engine.dispose()
    finally:
        if vhosts is not None:
            vhosts.delete_all()
    table(results, len(bench.active))
    if failed:
        print("FAILED: not every user got exactly one email", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
