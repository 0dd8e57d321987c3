"""Release a month of reports scheduled in their users' mornings, across 40 time zones, on PostgreSQL.

Usage: python bench/release.py [--users 100000,1000000] [--page-size 1000]

For each size: a database of its own on TEST_POSTGRES_URL's server, the users loaded by plain SQL
over ``generate_series`` (40 zones from UTC-11 to UTC+14, in turn), the month triggered with
``SEND_AT_LOCAL_TIME=09:00`` and walked in-process (every item recorded with its due time), then
the coordinator chain's release run in-process against a private redis-server as the broker, on a
clock that runs at the machine's rate but skips the idle hours between one due time and the
next, as the chain's delayed look would: so each release is as late as the work of releasing it
makes it. It prints, per size: the walk's time, the release's wall time, the release process's
CPU per item and PostgreSQL's (every server process, from /proc), how late the latest item of each
zone was released after its due time (or the trigger, for a zone due before it) on that clock, the release process's peak RSS during the release, and how
long ``reports progress`` (with its scheduled count) takes at the trigger.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select
from support import pg_connect, postgres_cpu_seconds, redis_server, temporary_database  # bench/support.py

from reports.database import create_db_engine, session_factory, upgrade
from reports.fanout import progress, runs
from reports.fanout.coordinator import walk_slice
from reports.local_time import SendSchedule, check_zone
from reports.models import ReportItem, User
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for

PERIOD = Period(2026, 10)
NINE = SendSchedule(datetime(2000, 1, 1, 9, 0).time(), "UTC")
TRIGGERED = datetime(2026, 11, 1, 0, 5)
#: Forty zones west to east, whole, half and quarter offsets among them. Far east of UTC the 1st's
#: 09:00 comes before October has ended there, so those are due on the 2nd: 33 due times in all.
ZONES = [
    "Pacific/Pago_Pago",
    "Pacific/Honolulu",
    "America/Anchorage",
    "America/Los_Angeles",
    "America/Denver",
    "America/Chicago",
    "America/New_York",
    "America/Halifax",
    "America/St_Johns",
    "America/Sao_Paulo",
    "Atlantic/South_Georgia",
    "Atlantic/Azores",
    "UTC",
    "Europe/London",
    "Europe/Berlin",
    "Europe/Istanbul",
    "Europe/Moscow",
    "Asia/Tehran",
    "Asia/Dubai",
    "Asia/Kabul",
    "Asia/Tashkent",
    "Asia/Kolkata",
    "Asia/Kathmandu",
    "Asia/Dhaka",
    "Asia/Yangon",
    "Asia/Bangkok",
    "Asia/Shanghai",
    "Australia/Eucla",
    "Asia/Tokyo",
    "Australia/Darwin",
    "Australia/Brisbane",
    "Australia/Adelaide",
    "Australia/Sydney",
    "Pacific/Noumea",
    "Pacific/Norfolk",
    "Pacific/Auckland",
    "Pacific/Chatham",
    "Pacific/Tongatapu",
    "Pacific/Kiritimati",
    "Asia/Jakarta",
]
#: What the issue asks: each item released within this of its due time.
TARGET_SECONDS = 60


class SkippingClock:
    """Naive UTC time that runs at the machine's rate from wherever it was last moved to."""

    def __init__(self, start: datetime) -> None:
        self.move_to(start)

    def move_to(self, moment: datetime) -> None:
        self._base, self._since = moment, time.monotonic()

    def __call__(self) -> datetime:
        return self._base + timedelta(seconds=time.monotonic() - self._since)


def load(url: str, users: int) -> None:
    upgrade(Settings(database_url=url))
    with pg_connect(url) as connection:
        connection.execute(
            "INSERT INTO users (id, email, name, active, time_zone) "
            "SELECT g, 'user' || g || '@example.test', 'User ' || g, true, (%s::text[])[g %% %s + 1] "
            "FROM generate_series(1, %s) g",
            (list(ZONES), len(ZONES), users),
        )
        connection.execute("VACUUM ANALYZE users")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    # 5: reset the peak resident set size to the current one (Linux 4.0 and later).
    Path("/proc/self/clear_refs").write_text("5")


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def run(users: int, page_size: int, redis_url: str) -> dict[str, float]:
    with temporary_database(prefix="reports_bench_release") as url:
        load(url, users)
        engine = create_db_engine(url)
        sessions = session_factory(engine)
        settings = Settings(database_url=url, broker_url=redis_url, broker_namespace=f"release-{users}")
        broker = build_broker(settings)
        queue = queue_for(broker)
        try:
            with sessions.begin() as session:
                runs.trigger(session, PERIOD, template_version="v1", now=TRIGGERED, schedule=NINE)

            def walk() -> None:
                while not walk_slice(
                    sessions, PERIOD, queue, page_size=page_size, budget_seconds=60, clock=lambda: TRIGGERED
                ).planned:
                    pass

            walk_seconds = timed(walk)
            with pg_connect(url) as connection:
                connection.execute("VACUUM ANALYZE report_items")
            progress_ms = []
            for _ in range(5):
                with sessions.begin() as session:
                    progress_ms.append(1000 * timed(lambda s=session: progress.count(s, PERIOD, TRIGGERED)))

            clock = SkippingClock(TRIGGERED)
            reset_peak_rss()
            cpu, pg_cpu, started = cpu_seconds(), postgres_cpu_seconds() or 0.0, time.perf_counter()
            looks = 0
            while True:
                outcome = walk_slice(sessions, PERIOD, queue, page_size=page_size, budget_seconds=10, clock=clock)
                looks += 1
                if outcome.release_in is None:
                    break
                if outcome.release_in > 0:
                    # The chain's delayed look: nothing to do until then, so skip to it.
                    clock.move_to(clock() + timedelta(seconds=outcome.release_in))
            release_seconds = time.perf_counter() - started
            cpu, pg_cpu = cpu_seconds() - cpu, (postgres_cpu_seconds() or 0.0) - pg_cpu
            peak = peak_rss_kib()

            with sessions.begin() as session:
                released = dict(
                    session.execute(
                        select(User.time_zone, func.max(ReportItem.enqueued_at))
                        .join(User, User.id == ReportItem.user_id)
                        .group_by(User.time_zone)
                    ).all()
                )
                handed_out = session.scalar(
                    select(func.count()).select_from(ReportItem).where(ReportItem.enqueued_at.is_not(None))
                )
            # A zone due before the trigger (Tokyo's 09:00 is 00:00 UTC) is due at the trigger.
            late = [
                (last - max(NINE.due_at(PERIOD, zone)[0], TRIGGERED)).total_seconds()
                for zone, last in released.items()
                if last
            ]
            assert handed_out == users, f"{handed_out} of {users} released"
            return {
                "users": users,
                "walk_s": walk_seconds,
                "release_s": release_seconds,
                "looks": looks,
                "cpu_us": 1e6 * cpu / users,
                "pg_cpu_us": 1e6 * pg_cpu / users,
                "late_max_s": max(late),
                "late_median_s": statistics.median(late),
                "over_target": sum(1 for seconds in late if seconds > TARGET_SECONDS),
                "peak_rss_mib": peak / 1024,
                "progress_ms": statistics.median(progress_ms),
            }
        finally:
            broker.close()
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="100000,1000000", help="comma-separated sizes")
    parser.add_argument("--page-size", type=int, default=1000)
    args = parser.parse_args()
    sizes = [int(size) for size in args.users.split(",")]
    assert len({check_zone(zone, "zone") for zone in ZONES}) == len(ZONES) == 40
    rows = []
    with tempfile.TemporaryDirectory() as folder, redis_server(Path(folder)) as redis_url:
        for users in sizes:
            row = run(users, args.page_size, redis_url)
            rows.append(row)
            print(
                f"{users:>9,} users: walk {row['walk_s']:.1f} s; release {row['release_s']:.1f} s in "
                f"{row['looks']:.0f} looks; release CPU {row['cpu_us']:.1f} µs/item (PostgreSQL "
                f"{row['pg_cpu_us']:.1f}); latest release after its due time: median {row['late_median_s']:.1f} s, "
                f"max {row['late_max_s']:.1f} s ({row['over_target']:.0f} of {len(ZONES)} zones over "
                f"{TARGET_SECONDS} s); peak RSS {row['peak_rss_mib']:.0f} MiB; progress at the trigger "
                f"{row['progress_ms']:.1f} ms",
                flush=True,
            )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(
            f"{last['users'] / first['users']:.0f}x the users: release CPU per item {last['cpu_us'] / first['cpu_us']:.2f}x, "
            f"PostgreSQL's {last['pg_cpu_us'] / first['pg_cpu_us']:.2f}x, peak RSS {last['peak_rss_mib'] / first['peak_rss_mib']:.2f}x"
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
