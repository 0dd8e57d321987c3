"""End to end: every user reported and mailed by two worker processes on PostgreSQL, against no queue.

Usage: .venv/bin/python bench/end_to_end.py [--users 40000] [--repeats 1] [--processes 2] [--threads 8]
                                            [--inactive-percent 0] [--timeout 3600]
                                            [--broker redis|rabbitmq|sqs|both] [--rabbitmq-url URL]
                                            [--code CHECKOUT]... [--no-plain] [--in-process-users 2000]
                                            [--in-process-smtp] [--months-kept 0]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server), a private redis-server and a local
SMTP sink in a process of its own (bench/smtp_sink.py), with --users users and their activities
seeded by `reports.ops.seed.seed` (what `reports seed --users N` runs) for last month, and
--months-kept earlier months' partitions, as a database that keeps a year has them (empty: what a
statement over the partitioned tables pays for is their number, not their rows):

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

Each queue run also prints its rate over each tenth of the users, the bulk pool's and the
redis-server's peak memory, and each table's size after it (bench/run_trace.py).

Each run prints its wall time, reports/s, the SMTP connections opened against the emails sent, the
PostgreSQL sessions opened, and the CPU per report of each part of the run, read from /proc at its
start and end (bench/proc_cpu.py: each process tree's utime + stime, threads and reaped children
included): the worker processes (the bulk pool, each process apart; or the plain processes), the
coordinator's pool, PostgreSQL (the whole server when it runs on this machine, with the backends
that exited meanwhile, so other databases' work on it is counted too; and this run's sessions
alone), the bench's redis-server, the SMTP sink and this script. It checks that every active user
got exactly one email (exit status 1 if not).

3. in-process: once per repeat, bench/per_report.py (--in-process-users users, on a database of its
   own) for each checkout whose workers ran, and at the end each queue kind's bulk workers' CPU per
   report over its checkout's in-process CPU per report (target at most 1.3). The loop sends nowhere;
   with --in-process-smtp it sends over SMTP to a sink of its own, as the workers do. --code CHECKOUT, given
   more than once, alternates the queue runs between those checkouts' workers (each runs with its own
   .venv; another checkout's runs are labelled BROKER@FOLDER): main's code against a branch's in one
   run. --cpu-affinity MODE, given more than once, alternates the bulk workers' WORKER_CPU_AFFINITY
   in the same way (runs with auto are labelled BROKER+pinned). --no-plain leaves out the plain
   runs. With --repeats N the kinds alternate (redis, rabbitmq, plain on odd repeats, the reverse
on even ones) and a table compares their medians; each queue's wall time over plain's is its
overhead. Redis is emptied before every run, so no run inherits another's shared state.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import proc_cpu  # bench/proc_cpu.py, beside this script
import redis
import run_trace  # bench/run_trace.py, beside this script
from smtp_sink import Delivered  # bench/smtp_sink.py, beside this script
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from support import (
    RABBITMQ_URL,
    ROOT,
    MailBench,
    Pools,
    Vhosts,
    interrupt_on_sigterm,
    mail_bench,
    pg_connect,
    python_of,
    settings_environ,
    watch_period,
)

from reports import partitions
from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.delivery import pipeline
from reports.fanout import coordinator, progress, runs
from reports.jobs import BUILD_REPORT, BULK_QUEUE, DEFAULT_QUEUE, ActorSpec, ReportJob
from reports.periods import previous_month
from reports.queue import InMemoryQueue
from reports.settings import CPU_AFFINITY_CHOICES, Settings
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
#: The parts of a run whose CPU is read from /proc: the worker processes (the bulk pool's, or the plain
#: processes) and the other processes a run keeps busy.
WORKERS = "workers"
PG_SERVER = "PostgreSQL"
#: This run's own database's sessions, a part of the server's figure (which counts other databases too).
PG_DATABASE = "PostgreSQL, this database"
#: The ratio of the bulk workers' CPU per report to bench/per_report.py's in-process CPU per report
#: that the workers' own overhead (Dramatiq, the consumer, SMTP, middleware) should stay within.
TARGET_WORKERS_RATIO = 1.3
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
    #: CPU seconds each part of the run spent (:mod:`proc_cpu`), by part and pid; a part that does
    #: not run on this machine (PostgreSQL on another) is missing.
    cpu: Mapping[str, Mapping[int, float]] = dataclasses.field(default_factory=dict)
    extra: str = ""

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds

    def cpu_ms_per_report(self, part: str) -> float | None:
        pids = self.cpu.get(part)
        return None if not pids else 1000 * sum(pids.values()) / self.delivered

    @property
    def pg_cpu_ms_per_report(self) -> float | None:
        return self.cpu_ms_per_report(PG_SERVER)

    def describe_cpu(self) -> str:
        """CPU ms per report of each part, the workers' by process, and of them all."""
        shown = []
        for part, pids in self.cpu.items():
            ms = 1000 * sum(pids.values()) / self.delivered
            if part == WORKERS:
                processes = sorted((1000 * s / self.delivered for s in pids.values() if s > 0.005), reverse=True)
                shown.append(f"{part} {ms:.3f} (by process: {' '.join(f'{p:.3f}' for p in processes)})")
            else:
                shown.append(f"{part} {ms:.3f}")
        # The database's sessions are a part of the server's figure.
        total = sum(sum(pids.values()) for part, pids in self.cpu.items() if part != PG_DATABASE)
        return f"CPU ms per report: {', '.join(shown)}; in all {1000 * total / self.delivered:.3f}"

    def describe(self, index: int) -> str:
        stats = self.delivered_check.stats
        planned = f"walk planned at {self.planned_seconds:.1f} s" if self.planned_seconds is not None else ""
        return (
            f"{self.kind:<8} #{index}: {self.delivered:,} reports in {self.seconds:.1f} s = {self.rate:,.0f} "
            f"reports/s ({planned}); SMTP: {stats['connections']:,} connections opened for "
            f"{stats['messages']:,} emails; PostgreSQL sessions opened: {self.pg_sessions:,}{self.extra}\n"
            f"            {self.delivered_check.describe()}\n"
            f"            {self.describe_cpu()}"
        )


# --------------------------------------------------------------------------- the database between runs


def pg_sessions(url: str) -> int:
    """Sessions ever opened on the database (pg_stat_database; PostgreSQL 14+)."""
    time.sleep(1.0)  # backends report their statistics within about a second
    with pg_connect(url) as connection:
        row = connection.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def empty_run_tables(url: str) -> None:
    with pg_connect(url) as connection:
        tables = ", ".join(
            name
            for (name,) in connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND NOT tablename = ANY(%s)",
                (list(SEEDED_TABLES),),
            )
        )
        connection.execute(f"TRUNCATE {tables} RESTART IDENTITY")
        connection.execute(f"VACUUM ANALYZE {tables}")


def keep_months(sessions: sessionmaker[Session], months: int) -> None:
    """Make the partitions of the ``months`` months before last month."""
    month = previous_month(utcnow())
    with sessions.begin() as session:
        for _ in range(months):
            month = month.previous()
            partitions.ensure(session, month)


def finish(
    kind: str,
    bench: MailBench,
    sessions: sessionmaker[Session],
    started: float,
    ended: float,
    planned_at: float | None,
    sessions_before: int,
    cpu: Mapping[str, Mapping[int, float]],
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
        cpu,
        extra,
    )


# --------------------------------------------------------------------------- CPU by process


def cpu_meter(bench: MailBench, workers: Iterable[int], coordinator: int | None = None) -> proc_cpu.Meter:
    """What a run's parts spend: the worker process trees, the coordinator's pool (a queue run's), this
    machine's PostgreSQL server and this run's sessions on it, the bench's redis-server, the SMTP sink,
    and this script (its own threads: the trigger and the progress reads; a plain run's walk; moto)."""
    database_url = make_url(bench.settings.database_url)
    database = database_url.database or ""
    parts: dict[str, proc_cpu.Part] = {WORKERS: proc_cpu.trees(*workers)}
    if coordinator is not None:
        parts["coordinator"] = proc_cpu.trees(coordinator)
    parts[PG_SERVER] = proc_cpu.postgres_server(database_url.port or 5432)
    parts[PG_DATABASE] = proc_cpu.postgres_database(database)
    redis_pid = proc_cpu.listening_on(make_url(bench.settings.broker_url).port or 6379)
    if redis_pid is not None:
        parts["Redis"] = proc_cpu.trees(redis_pid)
    parts["SMTP sink"] = proc_cpu.trees(bench.sink.process.pid)
    me = os.getpid()
    parts["this script"] = lambda snapshot: {me: snapshot[me].own}
    return proc_cpu.Meter(parts)


def in_process_ms(root: Path, users: int, *, smtp: bool) -> float:
    """CPU ms per report of ``pipeline.run`` in a loop: bench/per_report.py of the checkout at ``root``
    (its code, its ``.venv``), on a database of its own; with ``smtp``, sending as the workers do."""
    done = subprocess.run(
        [python_of(root), "bench/per_report.py", "--users", str(users), *(["--smtp"] if smtp else [])],
        cwd=root,
        # A script's own folder comes first on its path, not the checkout: without this a checkout
        # whose .venv installs another checkout's package (a worktree's, shared) would run that code.
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r"CPU per report\s+([\d.]+) ms", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"per_report.py in {root} failed ({done.returncode}):\n{done.stdout}{done.stderr[-3000:]}")
    return float(match[1])


# --------------------------------------------------------------------------- 1. through the queue


def queue_run(
    args: argparse.Namespace,
    bench: MailBench,
    sessions: sessionmaker[Session],
    kind: QueueKind,
    vhosts: Vhosts | None,
) -> Run:
    """One period through worker pools on the kind's broker (a fresh vhost when it is RabbitMQ),
    running the kind's checkout."""
    if kind.broker == "sqs":
        return sqs_run(args, bench, sessions, kind)
    vhost = None
    try:
        if kind.broker == "rabbitmq":
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


def sqs_run(args: argparse.Namespace, bench: MailBench, sessions: sessionmaker[Session], kind: QueueKind) -> Run:
    """One period through worker pools on moto's SQS, a fresh server; with the requests the run made."""
    requests: Counter[str] = Counter()
    os.environ.update(moto.CREDENTIALS)
    with moto.moto_server(requests) as endpoint, moto.temporary_prefix(endpoint) as url:
        settings = dataclasses.replace(bench.settings, broker_url=url, redis_url=bench.settings.broker_url)
        return _queue_run(args, bench, sessions, kind, settings, requests)


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
    kind: QueueKind,
    settings: Settings,
    requests: Counter[str] | None = None,
) -> Run:
    """:param requests: the broker's requests as its server counts them (SQS on moto), read from the
    trigger to the end of the run."""
    pools = Pools(bench.workdir, settings_environ(settings), root=kind.root)
    try:
        coordinator_pool = pools.start(f"{kind.label}-coordinator", DEFAULT_QUEUE, 1, 2)
        bulk_pool = pools.start(
            f"{kind.label}-bulk",
            BULK_QUEUE,
            args.processes,
            args.threads,
            {"WORKER_CPU_AFFINITY": kind.affinity},
        )
        broker = build_broker(settings)
        bench.sink.reset()
        before = pg_sessions(settings.database_url)
        meter = cpu_meter(bench, [bulk_pool.pid], coordinator_pool.pid)
        requests_before = Counter(requests)
        meter.start()
        started = time.monotonic()
        trace = run_trace.Trace(bulk_pool.pid, bench.settings.broker_url, started)
        runs.trigger_and_enqueue(
            sessions, queue_for(broker), bench.period, template_version=settings.template_version, now=utcnow()
        )
        _, planned_at = watch_period(
            sessions,
            bench.period,
            expected=len(bench.active),
            timeout=args.timeout,
            interval=POLL_SECONDS,
            on_progress=trace,
            alive=pools.check,
        )
        ended = time.monotonic()
        cpu = meter.stop()
        spent = Counter(requests) - requests_before
        broker.close()
    finally:
        pools.stop_all()
    extra = _requests_per_report(spent, len(bench.active)) if requests is not None else ""
    extra += trace.describe() + run_trace.table_sizes(settings.database_url)
    return finish(kind.label, bench, sessions, started, ended, planned_at, before, cpu, extra)


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
        meter = cpu_meter(bench, [process.pid for process in processes if process.pid is not None])

        class HandingOver(InMemoryQueue):
            def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
                sent = 0
                for payload in payloads:
                    jobs.put(payload)
                    sent += 1
                return sent

        meter.start()
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
        cpu = meter.stop()
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    others = {k: n for k, n in outcomes.items() if k != str(pipeline.Outcome.DELIVERED)}
    extra = f"; other outcomes: {others}" if others else ""
    return finish("plain", bench, sessions, started, ended, planned_at, before, cpu, extra)


# --------------------------------------------------------------------------- main


@dataclass(frozen=True)
class QueueKind:
    """A queue run's broker and the checkout whose workers run it."""

    broker: str
    root: Path
    #: The bulk workers' WORKER_CPU_AFFINITY.
    affinity: str = "none"

    @property
    def label(self) -> str:
        label = self.broker if self.root == ROOT else f"{self.broker}@{self.root.name}"
        return label if self.affinity == "none" else f"{label}+pinned"


def _median(figures: Iterable[float | None], digits: int = 2) -> str:
    known = [f for f in figures if f is not None]
    return f"{statistics.median(known):.{digits}f}" if known else "n/a"


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for i, cells in enumerate(rows):
        print(
            "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths, strict=True)))
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))


def table(results: dict[str, list[Run]], users: int) -> None:
    """Each kind's median wall time and rate, its ratio to plain, and whether every user got one email;
    then each kind's median CPU per report by part."""
    label = "median " if max(len(runs) for runs in results.values()) > 1 else ""
    plain = statistics.median(r.seconds for r in results["plain"]) if results.get("plain") else None
    header = [
        "run",
        f"{label}seconds",
        "reports/s",
        "/ plain",
        "each run's seconds",
        "workers CPU ms/report",
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
                "-" if kind == "plain" or plain is None else f"{seconds / plain:.3f}",
                " ".join(f"{r.seconds:.1f}" for r in kind_runs),
                _median((r.cpu_ms_per_report(WORKERS) for r in kind_runs), 3),
                _median(r.pg_cpu_ms_per_report for r in kind_runs),
                "yes" if all(r.delivered_check.ok for r in kind_runs) else "NO",
            ]
        )
    _print_table(rows)
    if "redis" in results and "rabbitmq" in results:
        redis_s = statistics.median(r.seconds for r in results["redis"])
        rabbitmq_s = statistics.median(r.seconds for r in results["rabbitmq"])
        print(f"rabbitmq / redis wall time = {rabbitmq_s / redis_s:.3f}")
    print("target for a queue / plain: within +10% (1.10); none for sqs, which runs on moto")

    parts = list(dict.fromkeys(part for kind_runs in results.values() for r in kind_runs for part in r.cpu))
    rows = [["CPU ms/report (median)", *parts]]
    for kind, kind_runs in results.items():
        rows.append([kind, *(_median((r.cpu_ms_per_report(part) for r in kind_runs), 3) for part in parts)])
    _print_table(rows)


def ratios(
    results: dict[str, list[Run]], kinds: Iterable[QueueKind], in_process: dict[Path, list[float]], *, smtp: bool
) -> None:
    """Each queue kind's workers' CPU per report over its checkout's in-process CPU per report."""
    print()
    for kind in kinds:
        measured = in_process.get(kind.root)
        workers = [ms for r in results[kind.label] if (ms := r.cpu_ms_per_report(WORKERS)) is not None]
        if not measured or not workers:
            continue
        inside, bulk = statistics.median(measured), statistics.median(workers)
        print(
            f"{kind.label}: bulk workers {bulk:.3f} ms CPU per report (median of {len(workers)}) / in-process "
            f"{inside:.3f} ms (bench/per_report.py{' --smtp' if smtp else ''}, median of {len(measured)}: "
            f"{' '.join(f'{m:.3f}' for m in measured)}) = {bulk / inside:.2f}x   target <= {TARGET_WORKERS_RATIO}x"
        )


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
    parser.add_argument(
        "--code",
        action="append",
        type=Path,
        default=[],
        metavar="CHECKOUT",
        help="a checkout (with its .venv) whose workers run the queue runs; repeat it to alternate them "
        "(another checkout's runs are labelled BROKER@FOLDER); default: this one",
    )
    parser.add_argument(
        "--cpu-affinity",
        action="append",
        choices=CPU_AFFINITY_CHOICES,
        default=[],
        metavar="MODE",
        help="the bulk workers' WORKER_CPU_AFFINITY (none, auto); repeat it to alternate them "
        "(runs with auto are labelled BROKER+pinned); default: none",
    )
    parser.add_argument("--no-plain", action="store_true", help="leave out the plain runs")
    parser.add_argument(
        "--in-process-users",
        type=int,
        default=2000,
        help="users of bench/per_report.py, run once per repeat for each --code checkout, to which the bulk "
        "workers' CPU per report is compared; 0 leaves it out",
    )
    parser.add_argument(
        "--in-process-smtp",
        action="store_true",
        help="the in-process loop sends each report over SMTP to a sink of its own, as the workers do, instead "
        "of nowhere (bench/per_report.py --smtp)",
    )
    parser.add_argument(
        "--months-kept",
        type=int,
        default=0,
        help="earlier months whose (empty) partitions the database holds, as one that keeps them does",
    )
    args = parser.parse_args()
    interrupt_on_sigterm()
    brokers = BROKERS[:2] if args.broker == "both" else (args.broker,)
    roots = list(dict.fromkeys(code.resolve() for code in args.code)) or [ROOT]
    affinities = list(dict.fromkeys(args.cpu_affinity)) or ["none"]
    queue_kinds = [QueueKind(broker, root, affinity) for broker in brokers for root in roots for affinity in affinities]
    vhosts = Vhosts(args.rabbitmq_url) if "rabbitmq" in brokers else None
    rabbitmq = ""
    if vhosts is not None:
        try:
            rabbitmq = f", RabbitMQ {vhosts.check()} (a vhost of each run's own)"
        except RuntimeError as error:
            parser.error(f"{error} (--broker redis leaves RabbitMQ out)")

    failed = False
    kinds: list[QueueKind | None] = [*queue_kinds, *([] if args.no_plain else [None])]  # None: plain
    results: dict[str, list[Run]] = {"plain" if kind is None else kind.label: [] for kind in kinds}
    in_process: dict[Path, list[float]] = {root: [] for root in roots}
    try:
        with mail_bench(users=args.users, inactive_percent=args.inactive_percent, prefix="end-to-end-bench-") as bench:
            print(
                f"{args.processes} processes x {args.threads} threads; PostgreSQL, redis-server{rabbitmq} and the "
                f"SMTP sink on this machine; workers of {', '.join(str(root) for root in roots)}",
                flush=True,
            )
            engine = create_db_engine(bench.settings.database_url)
            sessions = session_factory(engine)
            keep_months(sessions, args.months_kept)
            shared = redis.Redis.from_url(bench.settings.broker_url)
            for repeat in range(args.repeats):
                for kind in kinds if repeat % 2 == 0 else kinds[::-1]:
                    empty_run_tables(bench.settings.database_url)
                    shared.flushall()
                    if kind is None:
                        run = plain_run(args, bench, sessions)
                    else:
                        run = queue_run(args, bench, sessions, kind, vhosts)
                    results[run.kind].append(run)
                    failed |= not run.delivered_check.ok
                    print(run.describe(repeat + 1), flush=True)
                for root in roots if args.in_process_users <= 0 or repeat % 2 == 0 else roots[::-1]:
                    if args.in_process_users > 0:
                        in_process[root].append(in_process_ms(root, args.in_process_users, smtp=args.in_process_smtp))
                        print(f"in-process #{repeat + 1} ({root}): {in_process[root][-1]:.3f} ms CPU per report")
            shared.close()
            engine.dispose()
    finally:
        if vhosts is not None:
            vhosts.delete_all()
    table(results, len(bench.active))
    ratios(results, queue_kinds, in_process, smtp=args.in_process_smtp)
    if failed:
        print("FAILED: not every user got exactly one email", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
