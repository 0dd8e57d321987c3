"""Redis commands per message while a real worker pool mails a period: Dramatiq's own, and ours.

Usage: .venv/bin/python bench/redis_round_trips.py [--users 2000] [--processes 1] [--threads 8]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server), a private redis-server and a local
SMTP sink (bench/smtp_sink.py), with --users users seeded for last month (all active), worker pools
are started as the Procfile does (`dramatiq actors --queues bulk`, and the coordinator's `--queues
default`), the period is triggered as `reports trigger` does, and every command the server receives
is read with MONITOR from just before the trigger until the pools have stopped (after the period is
complete and a metrics flush has passed). Commands a Lua script runs are not counted (MONITOR marks
them ``lua``): a script call is one command and one round trip. MONITOR rather than ``INFO
commandstats``, which counts a script's inner commands and cannot tell one script's EVALSHA from
another's; MONITOR slows the server, so the run's rate is not a throughput figure.

Prints, per build_report message (one per user): Dramatiq's own commands (the dispatch script's
EVALSHA, by its command: fetch, ack, enqueue…), and ours: the breaker's script calls, the actor
metrics' commands and their MULTI/EXEC round trips, the heartbeat thread's writes, anything else.
The latest figures: docs/benchmarks.md (row 10).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import dramatiq.brokers.redis
import redis
from support import Pools, interrupt_on_sigterm, mail_bench, settings_environ, watch_period

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.delivery import breaker
from reports.fanout import runs
from reports.jobs import BULK_QUEUE, DEFAULT_QUEUE
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for

#: Seconds to wait after the period is complete: longer than a metrics flush interval.
SETTLE_SECONDS = 1.5

_TOKEN = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_SOURCE = re.compile(rb"^\S+ \[\d+ ([^\]]+)\] ")


def _sha(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()


_DRAMATIQ_SCRIPTS = {
    _sha(path.read_text()): path.stem for path in (Path(dramatiq.brokers.redis.__file__).parent / "redis").glob("*.lua")
}
DISPATCH_SHA = next(sha for sha, name in _DRAMATIQ_SCRIPTS.items() if name == "dispatch")
BREAKER_SHAS = {_sha(getattr(breaker, name)) for name in ("_ALLOW", "_FAILURE", "_SUCCESS")}


def _purpose(name: bytes, tokens: list[bytes]) -> str:
    if name == b"evalsha" and tokens[1] == DISPATCH_SHA:
        return f"dramatiq: {tokens[4].decode()}"
    if name == b"evalsha" and tokens[1] in _DRAMATIQ_SCRIPTS:
        return f"dramatiq: {_DRAMATIQ_SCRIPTS[tokens[1]]} script"  # maxstack: once per broker
    if name == b"evalsha" and tokens[1] in BREAKER_SHAS:
        return "ours: breaker script calls"
    if name in (b"hincrby", b"hincrbyfloat") and b":metrics:actor_" in tokens[1]:
        return "ours: actor metrics"
    if name in (b"hset", b"rpush") and tokens[1].startswith(b"bench:bulk"):
        return "dramatiq: enqueue in bulk (reports.worker.queues.RedisQueue.send_jobs)"
    if name == b"zadd" and tokens[1].endswith(b":__heartbeats__"):
        return "ours: heartbeat thread"
    if name == b"evalsha":
        return f"other: evalsha {tokens[1][:8].decode()}"
    return f"other: {name.decode()}"


class Monitor:
    """Every command the server receives from a client (not from a script), tallied by what it is for."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.counts: Counter[str] = Counter()
        self._in_multi: dict[bytes, list[str]] = {}
        self._monitor = self.client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._stopped = threading.Event()
        self._thread.start()

    def _read(self) -> None:
        connection = self._monitor.connection
        while not self._stopped.is_set():
            if not connection.can_read(timeout=0.2):
                continue
            line = connection.read_response()
            if isinstance(line, bytes) and line != b"OK":
                self._tally(line)

    def _tally(self, line: bytes) -> None:
        source = _SOURCE.match(line)
        if source is None or source.group(1) == b"lua":
            return
        client = source.group(1)
        tokens = _TOKEN.findall(line[source.end() :])
        name = tokens[0].lower()
        if name == b"multi":
            self._in_multi[client] = []
        elif name == b"exec":
            # One round trip: named for what its commands are for.
            purposes = self._in_multi.pop(client, [])
            self.counts[f"{purposes[0] if purposes else 'other: empty'} (MULTI/EXEC round trips)"] += 1
        elif client in self._in_multi:
            self._in_multi[client].append(_purpose(name, tokens))
            self.counts[f"{_purpose(name, tokens)} (commands in a MULTI)"] += 1
        else:
            self.counts[_purpose(name, tokens)] += 1

    def stop(self) -> Counter[str]:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._monitor.__exit__(None, None, None)
        self.client.close()
        return self.counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--processes", type=int, default=1, help="bulk pool processes")
    parser.add_argument("--threads", type=int, default=8, help="bulk pool threads per process")
    parser.add_argument("--timeout", type=float, default=600, help="seconds the run may take")
    args = parser.parse_args()
    interrupt_on_sigterm()
    print(f"code under test: {Path(breaker.__file__).resolve().parent.parent}", flush=True)

    with mail_bench(users=args.users, inactive_percent=0, prefix="redis-round-trips-bench-") as bench:
        engine = create_db_engine(bench.settings.database_url)
        sessions = session_factory(engine)
        pools = Pools(bench.workdir, settings_environ(bench.settings))
        monitor = None
        try:
            pools.start("coordinator", DEFAULT_QUEUE, 1, 2)
            pools.start("bulk", BULK_QUEUE, args.processes, args.threads)
            bench.sink.reset()
            monitor = Monitor(bench.settings.broker_url)
            started = time.monotonic()
            runs.trigger_and_enqueue(
                sessions,
                queue_for(build_broker(bench.settings)),
                bench.period,
                template_version=bench.settings.template_version,
                now=utcnow(),
            )
            final, _ = watch_period(
                sessions, bench.period, expected=len(bench.active), timeout=args.timeout, alive=pools.check
            )
            seconds = time.monotonic() - started
            time.sleep(SETTLE_SECONDS)
        finally:
            pools.stop_all()
            counts = monitor.stop() if monitor is not None else Counter()
            engine.dispose()
        delivered = bench.sink.check(bench.active)

    messages = final.total
    print(
        f"{messages:,} build_report messages in {seconds:.1f} s ({args.processes} x {args.threads} bulk workers); "
        f"{delivered.describe()}"
    )
    print(f"{'commands':>9} {'per message':>12}  what")
    for name, n in sorted(counts.items()):
        print(f"{n:>9,} {n / messages:>12.3f}  {name}")
    dramatiq_calls = sum(n for name, n in counts.items() if name.startswith("dramatiq:") and "MULTI" not in name)
    # Outside a MULTI the metrics came as one pipeline of three commands per message (the old code).
    metrics_trips = counts["ours: actor metrics (MULTI/EXEC round trips)"] + counts["ours: actor metrics"] / 3
    breaker_calls = counts["ours: breaker script calls"]
    print(
        f"per message: Dramatiq {dramatiq_calls / messages:.3f} script calls; ours {breaker_calls / messages:.3f} "
        f"breaker calls + {metrics_trips / messages:.3f} metrics round trips = "
        f"{(breaker_calls + metrics_trips) / messages:.3f} (the heartbeat thread's writes are per 3.75 s, not "
        f"per message)"
    )
    return 0 if delivered.ok else 1


if __name__ == "__main__":
    sys.exit(main())
