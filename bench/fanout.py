"""Fan-out: how fast the coordinator walks and enqueues, and what the broker's memory holds.

Usage: python bench/fanout.py [--users 1000000] [--loop-messages 20000] [--high-water 100000]
                              [--drain-rate 8000] [--pause-seconds 1]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server) and a private redis-server:
1. the coordinator (reports.fanout.coordinator.walk_slice, batched inserts, pipelined enqueue) walks every
   user with no high-water mark; prints users/s, Redis used_memory and bytes per queued message;
2. a loop of `broker.enqueue` (what `actor.send` does) for --loop-messages, in the same run: msg/s,
   and the ratio;
3. the whole walk again on a fresh period with the high-water mark, while a stand-in for the
   workers takes messages off the queue at --drain-rate a second (slower than the coordinator, so
   the backlog reaches the mark): the walk pauses, looks again after --pause-seconds (the actor
   re-enqueues itself with PLAN_PAUSE_SECONDS), and goes on; Redis used_memory is sampled every
   0.1 s and its peak printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime

import psycopg
import redis
from support import redis_server, temporary_database  # bench/support.py, beside this script

from reports.database import create_db_engine, session_factory, upgrade
from reports.fanout import coordinator, runs
from reports.jobs import BUILD_REPORT
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import backlog, build_broker, message_for, sender


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


@contextlib.contextmanager
def every(seconds: float, step: Callable[[], None]) -> Iterator[None]:
    """Run ``step`` every ``seconds`` in a thread while the block runs, and once more at its end."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        step()


class Drain:
    """A stand-in for the worker fleet: takes ``rate`` messages a second off the bulk queue (ids
    from its list, bodies from its hash), a slice at each :meth:`step`."""

    TICK = 0.05

    def __init__(self, settings: Settings, *, rate: int) -> None:
        self.client = redis.Redis.from_url(settings.broker_url)
        self.queue = f"{settings.broker_namespace}:{BUILD_REPORT.queue}"
        self.rate = rate
        self.taken = 0

    def step(self) -> None:
        ids = self.client.lpop(self.queue, int(self.rate * self.TICK)) or []
        if ids:
            self.client.hdel(f"{self.queue}.msgs", *ids)
            self.taken += len(ids)


class Peak:
    """The highest Redis used_memory seen at any :meth:`step`."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.bytes = _used_memory(client)

    def step(self) -> None:
        self.bytes = max(self.bytes, _used_memory(self.client))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--loop-messages", type=int, default=20_000)
    parser.add_argument("--high-water", type=int, default=100_000)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--drain-rate", type=int, default=8000, help="messages/s the stand-in workers take")
    parser.add_argument("--pause-seconds", type=float, default=1.0)
    args = parser.parse_args()

    with redis_server() as redis_url, temporary_database() as url:
        engine = None
        try:
            settings = Settings(database_url=url, broker_url=redis_url, broker_namespace="bench")
            client = redis.Redis.from_url(settings.broker_url)
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
            print(
                f"{args.users:,} users; page size {args.page_size}; nproc {os.cpu_count()}; {datetime.now():%Y-%m-%d %H:%M}"
            )

            # 1. The coordinator, no high-water mark.
            period = Period(2026, 10)
            with sessions.begin() as session:
                runs.trigger(session, period, template_version="v1", now=datetime.now())
            before = _used_memory(client)
            started = time.perf_counter()
            outcome = coordinator.SliceOutcome()
            while not outcome.planned:
                outcome = coordinator.walk_slice(
                    sessions,
                    period,
                    sender(broker, BUILD_REPORT),
                    page_size=args.page_size,
                    budget_seconds=3600,
                )
            planned_s = time.perf_counter() - started
            queued = backlog(broker, BUILD_REPORT.queue)
            used = _used_memory(client) - before
            rate = args.users / planned_s
            print(f"coordinator: planned and enqueued {args.users:,} users in {planned_s:.1f} s = {rate:,.0f} users/s")
            print(
                f"broker: {queued:,} messages queued, used_memory +{used / 1e6:.1f} MB = {used / queued:.0f} bytes/message"
            )

            # 2. A loop of single enqueues (what actor.send does), in the same run.
            client.flushall()
            payload = {"period": "2026-10", "user_id": 1, "template_version": "v1"}
            started = time.perf_counter()
            for _ in range(args.loop_messages):
                broker.enqueue(message_for(BUILD_REPORT, payload))
            loop_rate = args.loop_messages / (time.perf_counter() - started)
            print(f"loop of broker.enqueue: {loop_rate:,.0f} msg/s; coordinator / loop = {rate / loop_rate:.1f}x")

            # 3. The whole walk with the high-water mark, drained as workers would: Redis stays bounded.
            client.flushall()
            second = Period(2026, 9)
            with sessions.begin() as session:
                runs.trigger(session, second, template_version="v1", now=datetime.now())
            base = _used_memory(client)
            drain, peak = Drain(settings, rate=args.drain_rate), Peak(client)
            with every(Drain.TICK, drain.step), every(0.1, peak.step):
                started = time.perf_counter()
                pauses = 0
                outcome = coordinator.SliceOutcome()
                while not outcome.planned:
                    outcome = coordinator.walk_slice(
                        sessions,
                        second,
                        sender(broker, BUILD_REPORT),
                        page_size=args.page_size,
                        budget_seconds=3600,
                        backlog=lambda: backlog(broker, BUILD_REPORT.queue),
                        high_water=args.high_water,
                    )
                    if outcome.backlogged:
                        pauses += 1
                        time.sleep(args.pause_seconds)
                walked_s = time.perf_counter() - started
            print(
                f"with high water {args.high_water:,} and workers taking {args.drain_rate:,} msg/s: walked "
                f"{args.users:,} users in {walked_s:.0f} s, {pauses} pauses, {drain.taken:,} messages taken; "
                f"peak used_memory {peak.bytes / 1e6:.1f} MB (empty: {base / 1e6:.1f} MB), whatever the number of users"
            )
        finally:
            if engine is not None:
                engine.dispose()


if __name__ == "__main__":
    main()
