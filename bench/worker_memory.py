"""Worker memory as users grow: the bulk pool's RSS once --checkpoint users are delivered and at the end.

Usage: .venv/bin/python bench/worker_memory.py [--users 400000] [--checkpoint 40000] [--processes 2]
                                               [--threads 8] [--inactive-percent 0] [--timeout 14400]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server), a private redis-server and a local
SMTP sink in a process of its own (bench/smtp_sink.py), with --users users and their activities
seeded by `reports.ops.seed.seed` (what `reports seed` runs, 50,000 users a commit) for last month,
worker pools are started as the Procfile does: the bulk pool, `dramatiq actors --queues bulk
--processes 2 --threads 8`, and the coordinator's, `--queues default --processes 1 --threads 2`.
The period is triggered as `reports trigger` does, and `reports.fanout.progress` is read every --interval
seconds. The bulk pool's RSS (VmRSS from /proc/PID/status, summed over the `dramatiq` master and
every process below it) is sampled when the delivered count first reaches --checkpoint, at every
tenth of the users on the way, and when the period is complete. Prints the samples, the ratio
end / checkpoint (target: within 10%), the delivery rate, and checks that every active user got
exactly one email (exit status 1 if not, or if the ratio is over 1.10).
"""

from __future__ import annotations

import argparse
import sys
import time

from support import Pools, interrupt_on_sigterm, mail_bench, settings_environ, tree_rss_kib, watch_period

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.fanout import progress, runs
from reports.jobs import BULK_QUEUE, DEFAULT_QUEUE
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for

#: End / checkpoint RSS above this fails the target.
TARGET_RATIO = 1.10


class Sampler:
    """Samples the pool's RSS at the checkpoint, every tenth of the users, and at the end."""

    def __init__(self, pool_pid: int, users: int, checkpoint: int, started: float) -> None:
        self.pool_pid, self.started = pool_pid, started
        self.marks = sorted({checkpoint, *(users * tenth // 10 for tenth in range(1, 10))})
        self.checkpoint = checkpoint
        self.samples: dict[int, tuple[int, int]] = {}  # mark -> (delivered when sampled, KiB)

    def __call__(self, current: progress.Progress) -> None:
        while self.marks and current.delivered >= self.marks[0]:
            self.sample(self.marks.pop(0), current.delivered)

    def sample(self, mark: int, delivered: int) -> int:
        rss = tree_rss_kib(self.pool_pid)
        total = sum(rss.values())
        self.samples[mark] = (delivered, total)
        elapsed = time.monotonic() - self.started
        parts = " + ".join(f"{kib / 1024:.1f}" for _, kib in sorted(rss.items()))
        label = " (checkpoint)" if mark == self.checkpoint else ""
        print(
            f"  {delivered:>9,} delivered at {elapsed:7.1f} s ({delivered / elapsed:,.0f} reports/s): bulk pool "
            f"RSS {total / 1024:7.1f} MiB = {parts} over {len(rss)} processes{label}",
            flush=True,
        )
        return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=400_000)
    parser.add_argument("--checkpoint", type=int, default=40_000, help="delivered users at the first sample")
    parser.add_argument(
        "--inactive-percent",
        type=int,
        default=0,
        help="seeded users left inactive (reports seed's default is 10); 0: every user is mailed",
    )
    parser.add_argument("--processes", type=int, default=2, help="bulk pool processes")
    parser.add_argument("--threads", type=int, default=8, help="bulk pool threads per process")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between progress reads")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds the run may take")
    args = parser.parse_args()
    interrupt_on_sigterm()

    with mail_bench(users=args.users, inactive_percent=args.inactive_percent, prefix="worker-memory-bench-") as bench:
        active = bench.active
        if args.checkpoint > len(active):
            parser.error(f"--checkpoint {args.checkpoint:,} is above the {len(active):,} active users")
        engine = create_db_engine(bench.settings.database_url)
        sessions = session_factory(engine)
        pools = Pools(bench.workdir, settings_environ(bench.settings))
        try:
            pools.start("coordinator", DEFAULT_QUEUE, 1, 2)
            bulk = pools.start("bulk", BULK_QUEUE, args.processes, args.threads)
            booted = sum(tree_rss_kib(bulk.pid).values())
            print(f"bulk pool ({args.processes} x {args.threads}) booted: RSS {booted / 1024:.1f} MiB", flush=True)
            bench.sink.reset()
            started = time.monotonic()
            sampler = Sampler(bulk.pid, len(active), args.checkpoint, started)
            runs.trigger_and_enqueue(
                sessions,
                queue_for(build_broker(bench.settings)),
                bench.period,
                template_version=bench.settings.template_version,
                now=utcnow(),
            )
            final, _ = watch_period(
                sessions,
                bench.period,
                expected=len(active),
                timeout=args.timeout,
                interval=args.interval,
                on_progress=sampler,
                alive=pools.check,
            )
            seconds = time.monotonic() - started
            end = sampler.sample(len(active), final.delivered)
        finally:
            pools.stop_all()
            engine.dispose()
        delivered = bench.sink.check(active)
    at_checkpoint = sampler.samples[args.checkpoint][1]
    ratio = end / at_checkpoint
    print(f"{final.delivered:,} reports in {seconds:.1f} s = {final.delivered / seconds:,.0f} reports/s")
    print(delivered.describe())
    print(
        f"bulk pool RSS: {at_checkpoint / 1024:.1f} MiB at {args.checkpoint:,} delivered, {end / 1024:.1f} MiB at "
        f"{final.delivered:,}: end / checkpoint = {ratio:.3f} (target: within {TARGET_RATIO:.2f})"
    )
    return 0 if delivered.ok and ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
