"""Time one `reports exporter` scrape against a period of a million report items on PostgreSQL.

Usage: python bench/exporter_scrape.py [--items 1000000] [--pending-percent 10] [--scrapes 15]

Creates (and drops) a database of its own on TEST_POSTGRES_URL's server (default
postgresql://postgres@127.0.0.1:5432/postgres), fills one period with items by plain SQL,
and prints the median and max time of a full collection (Redis and database) over the scrapes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import redis
from items import period_of_items  # bench/items.py, beside this script
from support import temporary_database  # bench/support.py, beside this script

from reports.delivery.breaker import mail_breaker_name
from reports.models import ItemState
from reports.ops.metrics import ReportsCollector

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--pending-percent", type=int, default=10)
    parser.add_argument("--scrapes", type=int, default=15)
    args = parser.parse_args()

    with temporary_database() as url:
        measure(url, args)


def measure(url: str, args: argparse.Namespace) -> None:
    with period_of_items(url, items=args.items, percent={ItemState.PENDING: args.pending_percent}) as sessions:
        namespace = f"bench-{uuid.uuid4().hex[:8]}"
        collector = ReportsCollector(
            redis.Redis.from_url(REDIS_URL),
            namespace=namespace,
            sessions=sessions,
            queues=("critical", "default", "bulk"),
            breaker_name=mail_breaker_name(namespace),
        )
        timings = []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            samples = sum(len(metric.samples) for metric in collector.collect())
            timings.append(time.perf_counter() - started)
        print(
            f"one scrape ({samples} samples, a period still in progress): "
            f"median {statistics.median(timings) * 1000:.1f} ms, max {max(timings) * 1000:.1f} ms "
            f"over {args.scrapes} scrapes"
        )


if __name__ == "__main__":
    main()
