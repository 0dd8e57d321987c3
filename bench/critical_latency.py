"""Benchmark: how long a ``send-now`` request takes while the bulk queue holds a 50,000-message backlog.

Usage (from the repository root)::

    .venv/bin/python bench/critical_latency.py [--requests 30] [--backlog 50000]

What it sets up, all of its own and all removed on the way out (Ctrl-C included):

- a PostgreSQL database (created on ``--postgres-url``'s server, migrated with
  ``reports.database.upgrade``, dropped at the end) with ``--users`` active users;
- a private key namespace on the Redis at ``--redis-url`` (its keys deleted at the end);
- a local aiosmtpd server that records when each message arrives;
- the period triggered and planned in-process (``reports.fanout.coordinator.walk_slice``) with a sender that
  enqueues every real payload many times over (``RedisQueue.send_jobs``), so the bulk queue holds
  ``--backlog`` *valid* ``build_report`` messages: the first copy per user sends the monthly email, the
  rest are absorbed by the idempotent consumer. A feeder keeps the bulk queue topped up to the backlog
  while measuring, so every request faces the whole backlog however fast the bulk pool drains it;
- real worker pools started as the Procfile does, with ``python -m dramatiq actors``:
  bulk (``--queues bulk``, 2 processes x 8 threads) and critical (``--queues critical``, 1 x 4).

Then two measurements of the time from enqueue to the email's arrival at the SMTP server:

1. ``critical queue``: ``--requests`` send-now messages (``send_report_now`` on the critical queue),
   one at a time, each after an idle pause of 0.5-1.5 s (a request arrives when the critical pool is
   idle, as it usually is).
2. ``bulk queue``: the same message put on the bulk queue instead (``dramatiq.Message`` with
   ``queue_name='bulk'``; a bulk worker declares every actor, so it runs it), behind the backlog.
   These would take minutes each one at a time, so they are sent on the same schedule without waiting
   for each other; each one's latency is still its own enqueue-to-arrival time.

It prints p50, p99 and max for each, the bulk backlog at the start and end of each, and the ratio.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dramatiq
import redis
from aiosmtpd.controller import Controller
from sqlalchemy import text
from support import Pools, free_port, temporary_database  # bench/support.py, beside this script

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory, upgrade
from reports.fanout import coordinator, runs
from reports.jobs import BUILD_REPORT, BULK_QUEUE, CRITICAL_QUEUE, SEND_NOW, ActorSpec, SendNowJob
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import build_broker, send
from reports.worker.queues import RedisQueue

PERIOD = Period(2026, 10)
DOMAIN = "bench.test"
#: Dramatiq reads its worker's idle poll timeout from this lowercase variable.
WORKER_TIMEOUT_VARIABLE = "dramatiq_worker_timeout"


# --------------------------------------------------------------------------- SMTP


class ArrivalRecorder:
    """An SMTP handler that notes the monotonic time each Message-ID arrives."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.count = 0
        self.condition = threading.Condition()

    async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]
        now = time.monotonic()
        headers = email.parser.BytesHeaderParser(policy=email.policy.default).parsebytes(envelope.content)
        with self.condition:
            self.arrived[str(headers["Message-ID"]).strip()] = now
            self.count += 1
            self.condition.notify_all()
        return "250 Message accepted for delivery"

    def wait_for(self, message_id: str, timeout: float) -> float | None:
        with self.condition:
            self.condition.wait_for(lambda: message_id in self.arrived, timeout=timeout)
            return self.arrived.get(message_id)


# --------------------------------------------------------------------------- database


def load_users(settings: Settings, count: int) -> None:
    """Active users with a few activities in the period and the month before, by plain SQL."""
    engine = create_db_engine(settings.database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO users (id, email, name, active) VALUES (:id, :email, :name, true)"),
                [{"id": i, "email": f"user{i}@example.test", "name": f"User {i}"} for i in range(1, count + 1)],
            )
            connection.execute(
                text("INSERT INTO activities (user_id, occurred_at, category, amount_cents) VALUES (:u, :at, :c, :a)"),
                [
                    {"u": i, "at": at, "c": c, "a": 100 * i}
                    for i in range(1, count + 1)
                    for at, c in (
                        ("2026-10-05 10:00:00", "food"),
                        ("2026-10-20 18:00:00", "travel"),
                        ("2026-09-12 09:00:00", "food"),
                    )
                ],
            )
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- measurement


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


class Feeder:
    """Keeps the bulk queue topped up to the backlog with valid copies of the period's payloads."""

    def __init__(self, broker: Any, client: redis.Redis, key: str, payloads: list[dict[str, Any]], target: int):
        self.broker, self.client, self.key, self.payloads, self.target = broker, client, key, payloads, target
        self.stopping = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def _run(self) -> None:
        while not self.stopping.wait(0.25):
            missing = self.target - self.client.llen(self.key)
            if missing > 0:
                self.sent += RedisQueue(self.broker).send_jobs(BUILD_REPORT, self._copies(missing))

    def _copies(self, n: int) -> Iterable[dict[str, Any]]:
        for i in range(n):
            yield self.payloads[i % len(self.payloads)]

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()


def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-critical-"))
    namespace = f"bench-critical-{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(args.redis_url)
    client.ping()
    recorder = ArrivalRecorder()
    port = free_port()
    controller = Controller(recorder, hostname="127.0.0.1", port=port)
    controller.start()
    pools: Pools | None = None
    try:
        with temporary_database(args.postgres_url) as database_url:
            settings = Settings(
                var_dir=workdir / "var",
                database_url=database_url,
                broker_url=args.redis_url,
                broker_namespace=namespace,
                smtp_url=f"smtp://127.0.0.1:{port}",
                mail_from=f"Monthly Reports <reports@{DOMAIN}>",
            )
            upgrade(settings)
            load_users(settings, args.users)
            sessions = session_factory(create_db_engine(settings.database_url))
            broker = build_broker(settings)
            bulk_key = f"{namespace}:{BULK_QUEUE}"

            with sessions.begin() as session:
                runs.trigger(session, PERIOD, template_version=settings.template_version, now=utcnow())
            copies = -(-args.backlog // args.users)
            payloads: list[dict[str, Any]] = []

            class Flooding(RedisQueue):
                def send_jobs(self, spec: ActorSpec, batch: Iterable[Mapping[str, Any]]) -> int:
                    page = list(batch)
                    payloads.extend(page)
                    return super().send_jobs(spec, (payload for _ in range(copies) for payload in page))

            started = time.monotonic()
            outcome = coordinator.walk_slice(sessions, PERIOD, Flooding(broker), page_size=1000, budget_seconds=600)
            fill_seconds = time.monotonic() - started
            assert outcome.planned, outcome
            print(
                f"bulk queue filled: {client.llen(bulk_key):,} build_report messages for {len(payloads)} "
                f"users in {fill_seconds:.1f} s ({client.llen(bulk_key) / fill_seconds:,.0f} msg/s)"
            )

            env = {k: v for k, v in os.environ.items() if k not in _SETTINGS_VARIABLES}
            env.update(settings.as_environ())
            pools = Pools(workdir, env)
            critical_env = {WORKER_TIMEOUT_VARIABLE: str(args.worker_timeout_ms)} if args.worker_timeout_ms else {}
            pools.start("critical", CRITICAL_QUEUE, args.critical_processes, args.critical_threads, critical_env)
            pools.start("bulk", BULK_QUEUE, args.bulk_processes, args.bulk_threads, {})
            print(
                f"pools: critical {args.critical_processes}x{args.critical_threads}, bulk "
                f"{args.bulk_processes}x{args.bulk_threads} (python -m dramatiq actors --queues ...); "
                f"{os.cpu_count()} CPUs; dramatiq_worker_timeout "
                f"{args.worker_timeout_ms or os.environ.get(WORKER_TIMEOUT_VARIABLE, 'default (1000 ms)')}"
            )

            # Wait until user 1's monthly email is out, so every request below is a send-now email with a
            # Message-ID of its own.
            monthly = f"<report.{PERIOD}.1@{DOMAIN}>"
            if recorder.wait_for(monthly, timeout=60) is None:
                raise RuntimeError("the bulk pool never sent user 1's monthly email")

            with Feeder(broker, client, bulk_key, payloads, client.llen(bulk_key)) as feeder:
                time.sleep(0.5)
                critical = measure(args, broker, recorder, client, bulk_key, settings, on_bulk=False)
                bulk = measure(args, broker, recorder, client, bulk_key, settings, on_bulk=True)
            consumed = critical.backlog_start + feeder.sent - bulk.backlog_end
            rate = consumed / max(critical.seconds + bulk.seconds, 1e-9)
            print(
                f"bulk pool throughput while measuring: ~{rate:,.0f} msg/s (feeder topped up {feeder.sent:,} messages)"
            )
            print()
            for result in (critical, bulk):
                result.show()
            print()
            ratio = statistics.median(bulk.latencies) / statistics.median(critical.latencies)
            print(
                f"separate queues: p50 {ratio:,.0f}x faster "
                f"(bulk-queue p50 {statistics.median(bulk.latencies):.2f} s vs critical-queue p50 "
                f"{statistics.median(critical.latencies) * 1000:.0f} ms); p99 "
                f"{percentile(bulk.latencies, 99) / percentile(critical.latencies, 99):,.0f}x"
            )
            within = sum(latency < 1.0 for latency in critical.latencies)
            print(f"critical requests within 1 s: {within}/{len(critical.latencies)}")
            broker.close()
            pools.stop_all()
            pools = None
            sessions.kw["bind"].dispose()
    finally:
        if pools is not None:
            pools.stop_all()
        controller.stop()
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i : i + 1000])
        shutil.rmtree(workdir, ignore_errors=True)


class Result:
    def __init__(self, label: str) -> None:
        self.label = label
        self.latencies: list[float] = []
        self.backlog_start = self.backlog_end = 0
        self.seconds = 0.0
        self.lost = 0

    def show(self) -> None:
        lat = self.latencies
        print(
            f"{self.label:<32} n={len(lat):<3} p50 {statistics.median(lat) * 1000:8.0f} ms   "
            f"p99 {percentile(lat, 99) * 1000:8.0f} ms   max {max(lat) * 1000:8.0f} ms   "
            f"bulk backlog {self.backlog_start:,} -> {self.backlog_end:,}"
            + (f"   ({self.lost} never arrived)" if self.lost else "")
        )


def measure(
    args: argparse.Namespace,
    broker: Any,
    recorder: ArrivalRecorder,
    client: redis.Redis,
    bulk_key: str,
    settings: Settings,
    *,
    on_bulk: bool,
) -> Result:
    result = Result("send-now on the bulk queue" if on_bulk else "send-now on the critical queue")
    result.backlog_start = client.llen(bulk_key)
    began = time.monotonic()
    sent: list[tuple[str, float]] = []
    for _ in range(args.requests):
        time.sleep(random.uniform(0.5, 1.5))
        job = SendNowJob(PERIOD, 1, str(uuid.uuid4()), settings.template_version)
        message_id = f"<report.{PERIOD}.1.{job.request_id}@{DOMAIN}>"
        if on_bulk:
            message = dramatiq.Message(
                queue_name=BULK_QUEUE, actor_name=SEND_NOW.name, args=(), kwargs=job.payload(), options={}
            )
            at = time.monotonic()
            broker.enqueue(message)
            sent.append((message_id, at))
        else:
            at = time.monotonic()
            send(broker, SEND_NOW, job.payload())
            arrived = recorder.wait_for(message_id, timeout=args.timeout)
            if arrived is None:
                result.lost += 1
            else:
                result.latencies.append(arrived - at)
    for message_id, at in sent:
        arrived = recorder.wait_for(message_id, timeout=max(args.timeout - (time.monotonic() - at), 0.1))
        if arrived is None:
            result.lost += 1
        else:
            result.latencies.append(arrived - at)
    result.backlog_end = client.llen(bulk_key)
    result.seconds = time.monotonic() - began
    if not result.latencies:
        raise RuntimeError(f"{result.label}: no request arrived within {args.timeout} s")
    return result


_SETTINGS_VARIABLES = {
    "DATABASE_URL",
    "BROKER_URL",
    "BROKER_NAMESPACE",
    "SMTP_URL",
    "MAIL_FROM",
    "dramatiq_worker_timeout",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="send-now requests per measurement")
    parser.add_argument("--backlog", type=int, default=50_000, help="bulk messages kept waiting")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--bulk-processes", type=int, default=2)
    parser.add_argument("--bulk-threads", type=int, default=8)
    parser.add_argument("--critical-processes", type=int, default=1)
    parser.add_argument("--critical-threads", type=int, default=4)
    parser.add_argument(
        "--worker-timeout-ms",
        type=int,
        default=0,
        help="dramatiq_worker_timeout for the critical pool (its idle poll); 0: as the Procfile",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for one request")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--redis-url", default=os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    run(args)


if __name__ == "__main__":
    main()
