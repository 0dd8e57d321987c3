"""Time `reports progress PERIOD --json` against a period of a million report items on PostgreSQL.

Usage: python bench/progress.py [--items 1000000] [--repeats 50]

Creates (and drops) a database of its own on TEST_POSTGRES_URL's server (default
postgresql://postgres@127.0.0.1:5432/postgres) and fills one period by plain SQL as a run leaves
it midway: the walk done, 86 % delivered, 10 % pending, 3 % skipped, 1 % dead, so not complete.
Then it times what the command does to answer, `reports.fanout.progress.count` in one transaction from
the pool (warmed once, then --repeats times: median, p95 and max), and runs the command itself
once as a subprocess: that figure includes starting Python and importing the CLI, so
`reports --help` (no database) is timed once beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from items import PERIOD, period_of_items  # bench/items.py, beside this script
from support import temporary_database  # bench/support.py, beside this script

from reports.fanout import progress
from reports.models import ItemState

#: What the issue asks of one answer, in milliseconds.
TARGET_MS = 50
#: A period midway: every state but delivered, in whole percent of the items.
MIX = {ItemState.PENDING: 10, ItemState.SKIPPED: 3, ItemState.DEAD: 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    with temporary_database() as url:
        measure(url, args)


def measure(url: str, args: argparse.Namespace) -> None:
    with period_of_items(url, items=args.items, percent=MIX, planned=True) as sessions:

        def read() -> progress.Progress:
            # What `reports progress` does (reports/cli/periods.py): one transaction, one count.
            with sessions.begin() as session:
                return progress.count(session, PERIOD)

        answer = read()  # warm: the pool's connection, the statement caches, the table's pages
        assert not answer.complete and answer.total == args.items, answer
        print(f"answer: {json.dumps(answer.as_dict())}")
        timings = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            read()
            timings.append((time.perf_counter() - started) * 1000)
        print(
            f"progress.count, {args.items:,} items: median {statistics.median(timings):.1f} ms, "
            f"p95 {percentile(timings, 95):.1f} ms, max {max(timings):.1f} ms over {args.repeats} reads "
            f"(target {TARGET_MS} ms)"
        )

        command = reports_command()
        env = {**os.environ, "DATABASE_URL": url}
        startup_ms, _ = timed(command + ["--help"], env)
        total_ms, output = timed(command + ["progress", str(PERIOD), "--json"], env)
        assert json.loads(output) == answer.as_dict(), output
        print(
            f"`reports progress {PERIOD} --json` as a new process, once: {total_ms:.0f} ms; "
            f"`reports --help` (starting Python and importing the CLI, no database), once: {startup_ms:.0f} ms"
        )


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile: the smallest value at or above ``p`` % of the values."""
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]


def reports_command() -> list[str]:
    """The `reports` entry point installed beside this Python, else the package run as a module."""
    script = Path(sys.executable).parent / "reports"
    return [str(script)] if script.exists() else [sys.executable, "-m", "reports"]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Run ``argv`` to its end; its wall time in milliseconds and its standard output."""
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return (time.perf_counter() - started) * 1000, result.stdout


if __name__ == "__main__":
    main()
