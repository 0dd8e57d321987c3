"""A month against a mail server that limits its client: its time against the server's pace, the
refusals per message, and the worker log's lines per message.

Usage: .venv/bin/python bench/provider_pace.py [--users 600] [--limit 50] [--window 10]
                                               [--processes 2] [--threads 8] [--ceiling RATE]

On a PostgreSQL database of its own, a private redis-server and --users seeded users (as
`reports seed` does), an aiosmtpd server on the loopback (tests/support/smtp.py) accepts at most
--limit messages per --window seconds from the client, as Postfix's anvil counts them, and
answers `450 4.7.1 Error: too much mail from 127.0.0.1` past it. Worker pools start as the
Procfile's do (`--queues bulk --processes 2 --threads 8`, and the coordinator's); the period is
triggered as `reports trigger` does and the clock stops when progress says it is complete.
--ceiling sets SEND_RATE_PER_SECOND (default: unset).

It prints the month's time against the server's pace (active users / (limit / window)), the
refusals per message (all, and after the first two windows, once the rate has settled), the
worker log's lines per message, its ERROR lines and tracebacks, and checks that every active user
got exactly one email (exit status 1 if not). The targets: within 1.3x the pace, at most one
refusal per ten messages once settled, no traceback. The latest figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from collections import Counter

from aiosmtpd.controller import Controller
from support import Pools, free_port, mail_bench, settings_environ, watch_period  # bench/support.py

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.fanout import runs
from reports.jobs import BULK_QUEUE, DEFAULT_QUEUE
from reports.worker.broker import build_broker
from tests.support.smtp import RateLimit, RecordingHandler

#: The targets.
TARGET_PACE_RATIO = 1.3
TARGET_SETTLED_REFUSALS = 0.1
#: Windows after which the rate counts as settled.
SETTLING_WINDOWS = 2


class TimedHandler(RecordingHandler):
    """Also notes when each refusal about the pace was given, to count those after the settling."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_at: list[float] = []

    async def handle_MAIL(self, server, session, envelope, address, mail_options):  # type: ignore[no-untyped-def]
        before = self.rate_refusals
        reply = await super().handle_MAIL(server, session, envelope, address, mail_options)
        if self.rate_refusals > before:
            self.refused_at.append(time.monotonic())
        return reply


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=600)
    parser.add_argument("--limit", type=int, default=50, help="messages the server accepts per window")
    parser.add_argument("--window", type=float, default=10.0, help="the server's window, in seconds")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--ceiling", type=float, default=None, help="SEND_RATE_PER_SECOND")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args()

    handler = TimedHandler()
    handler.rate_limit = RateLimit(messages=args.limit, window_seconds=args.window)
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        with mail_bench(users=args.users, inactive_percent=0, prefix="bench-pace-") as bench:
            settings = dataclasses.replace(
                bench.settings, smtp_url=f"smtp://127.0.0.1:{port}", send_rate_per_second=args.ceiling
            )
            sessions = session_factory(create_db_engine(settings.database_url))
            pools = Pools(bench.workdir, settings_environ(settings))
            try:
                pools.start("coordinator", DEFAULT_QUEUE, 1, 2)
                pools.start("bulk", BULK_QUEUE, args.processes, args.threads)
                broker = build_broker(settings)
                started = time.monotonic()
                runs.trigger_and_enqueue(
                    sessions, broker, bench.period, template_version=settings.template_version, now=utcnow()
                )
                watch_period(
                    sessions, bench.period, expected=len(bench.active), timeout=args.timeout, alive=pools.check
                )
                elapsed = time.monotonic() - started
                broker.close()
            finally:
                pools.stop_all()
            log = (bench.workdir / "bulk.log").read_text(errors="replace")
            return report(args, handler, bench.active, started, elapsed, log)
    finally:
        controller.stop()


def report(
    args: argparse.Namespace, handler: TimedHandler, active: set[int], started: float, elapsed: float, log: str
) -> int:
    users = len(active)
    pace = handler.rate_limit.pace_seconds(users)  # type: ignore[union-attr]
    settled_from = started + SETTLING_WINDOWS * args.window
    settled = [at for at in handler.refused_at if at >= settled_from]
    lines = log.splitlines()
    errors = [line for line in lines if re.search(r"\[(ERROR|CRITICAL)\]", line)]
    per_user = Counter(int(message["X-Report-User-Id"]) for _, message in handler.messages)
    exact = set(per_user) == active and set(per_user.values()) == {1}
    ratio = elapsed / pace
    settled_per_message = len(settled) / users
    print(
        f"server: {args.limit} messages per {args.window:g} s; {users:,} users; "
        f"{args.processes} x {args.threads} worker threads; SEND_RATE_PER_SECOND {args.ceiling}"
    )
    print(
        f"month: {elapsed:.1f} s against the server's pace of {pace:.1f} s: {ratio:.2f}x (target <= {TARGET_PACE_RATIO})"
    )
    print(
        f"refusals: {handler.rate_refusals:,} ({handler.rate_refusals / users:.3f} per message); after the first "
        f"{SETTLING_WINDOWS} windows {len(settled):,} ({settled_per_message:.3f} per message, target <= {TARGET_SETTLED_REFUSALS})"
    )
    print(
        f"worker log: {len(lines):,} lines ({len(lines) / users:.2f} per message), {len(errors)} ERROR, "
        f"{log.count('Traceback')} tracebacks, {sum('Deferred message' in line for line in lines):,} deferral lines"
    )
    print(f"every active user exactly one email: {exact}")
    met = exact and ratio <= TARGET_PACE_RATIO and settled_per_message <= TARGET_SETTLED_REFUSALS and not errors
    print("targets met" if met else "targets NOT met")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
