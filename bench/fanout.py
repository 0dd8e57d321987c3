"""Fan-out: how fast the coordinator plans and enqueues, and what the broker's memory holds.

Usage: python bench/fanout.py [--users 1000000] [--loop-messages 20000] [--high-water 100000]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server) and a private redis-server:
1. the coordinator (reports.planning.plan_slice, batched inserts, pipelined enqueue) plans every
   user with no high-water mark; prints users/s, Redis used_memory and bytes per queued message;
2. a loop of `broker.enqueue` (what `actor.send` does) for --loop-messages, in the same run: msg/s,
   and the ratio;
3. the walk again on a fresh period with the high-water mark: where Redis memory stops.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from datetime import datetime

import psycopg
import redis
from support import temporary_database  # bench/support.py, beside this script

from reports import planning, runs
from reports.broker import backlog, build_broker, message_for, send_many
from reports.database import create_db_engine, session_factory, upgrade
from reports.jobs import BUILD_REPORT
from reports.periods import Period
from reports.settings import Settings


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--loop-messages", type=int, default=20_000)
    parser.add_argument("--high-water", type=int, default=100_000)
    parser.add_argument("--page-size", type=int, default=1000)
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="fanout-bench-")
    port = _free_port()
    server = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                               "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder],
                              stdout=subprocess.DEVNULL)
    with temporary_database() as url:
        engine = None
        try:
            settings = Settings(database_url=url, broker_url=f"redis://127.0.0.1:{port}/0", broker_namespace="bench")
            client = redis.Redis.from_url(settings.broker_url)
            for _ in range(100):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            upgrade(settings)
            with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as connection:
                connection.execute(
                    "INSERT INTO users (id, email, name, active) "
                    "SELECT g, 'user' || g || '@example.test', 'User ' || g, true FROM generate_series(1, %s) g",
                    (args.users,),
                )
                connection.execute("VACUUM ANALYZE users")
            engine = create_db_engine(url)
            sessions = session_factory(engine)
            broker = build_broker(settings)
            print(f"{args.users:,} users; page size {args.page_size}; nproc {os.cpu_count()}; {datetime.now():%Y-%m-%d %H:%M}")

            # 1. The coordinator, no high-water mark.
            period = Period(2026, 10)
            with sessions.begin() as session:
                runs.trigger(session, period, template_version="v1", now=datetime.now())
            before = _used_memory(client)
            started = time.perf_counter()
            outcome = planning.SliceOutcome()
            while not outcome.planned:
                outcome = planning.plan_slice(sessions, period, lambda p: send_many(broker, BUILD_REPORT, p),
                                              page_size=args.page_size, budget_seconds=3600)
            planned_s = time.perf_counter() - started
            queued = backlog(broker, BUILD_REPORT.queue)
            used = _used_memory(client) - before
            rate = args.users / planned_s
            print(f"coordinator: planned and enqueued {args.users:,} users in {planned_s:.1f} s = {rate:,.0f} users/s")
            print(f"broker: {queued:,} messages queued, used_memory +{used / 1e6:.1f} MB = {used / queued:.0f} bytes/message")

            # 2. A loop of single enqueues (what actor.send does), in the same run.
            client.flushall()
            payload = {"period": "2026-10", "user_id": 1, "template_version": "v1"}
            started = time.perf_counter()
            for _ in range(args.loop_messages):
                broker.enqueue(message_for(BUILD_REPORT, payload))
            loop_rate = args.loop_messages / (time.perf_counter() - started)
            print(f"loop of broker.enqueue: {loop_rate:,.0f} msg/s; coordinator / loop = {rate / loop_rate:.1f}x")

            # 3. The same walk with the high-water mark: the backlog, and Redis, stop there.
            client.flushall()
            second = Period(2026, 9)
            with sessions.begin() as session:
                runs.trigger(session, second, template_version="v1", now=datetime.now())
            before = _used_memory(client)
            paused = planning.plan_slice(
                sessions, second, lambda p: send_many(broker, BUILD_REPORT, p), page_size=args.page_size,
                budget_seconds=3600, backlog=lambda: backlog(broker, BUILD_REPORT.queue), high_water=args.high_water,
            )
            peak = _used_memory(client)
            print(f"with high water {args.high_water:,}: paused={paused.backlogged} after "
                  f"{backlog(broker, BUILD_REPORT.queue):,} queued; used_memory {peak / 1e6:.1f} MB "
                  f"(+{(peak - before) / 1e6:.1f} MB), whatever the number of users")
        finally:
            if engine is not None:
                engine.dispose()
            server.terminate()
            server.wait(timeout=10)
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
