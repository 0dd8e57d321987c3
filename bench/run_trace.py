"""What a long queue run did over time: its rate by tenth of the users, the bulk workers' memory and
the broker's, and what the database holds after it. For end_to_end.py's runs of a million users,
where one figure for the whole run would hide a rate that sags as the tables grow."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis
from support import pg_connect, tree_rss_kib

from reports.fanout import progress

#: Seconds between memory samples; progress is recorded at every reading.
MEMORY_EVERY_SECONDS = 2.0
#: Tenths of a run whose rates are printed.
TENTHS = 10


@dataclass
class Trace:
    """Fed every progress reading of a run (``watch_period``'s ``on_progress``)."""

    pool_pid: int
    #: The bench's redis-server: the broker on Redis runs, the shared state on the others.
    redis_url: str
    started: float
    readings: list[tuple[float, int]] = field(default_factory=list)
    #: Peak of the bulk pool's RSS summed over its processes, and of each process, in KiB.
    peak_pool_kib: int = 0
    peak_process_kib: int = 0
    #: Peak of Redis's ``used_memory`` (bytes), sampled.
    peak_redis_bytes: int = 0
    _memory_at: float = 0.0
    _redis: redis.Redis = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # One connection for the run's samples, not one every sample.
        self._redis = redis.Redis.from_url(self.redis_url)

    def __call__(self, current: progress.Progress) -> None:
        now = time.monotonic()
        self.readings.append((now - self.started, current.delivered))
        if now - self._memory_at >= MEMORY_EVERY_SECONDS:
            self._memory_at = now
            self.sample_memory()

    def sample_memory(self) -> None:
        rss = tree_rss_kib(self.pool_pid)
        self.peak_pool_kib = max(self.peak_pool_kib, sum(rss.values()))
        self.peak_process_kib = max(self.peak_process_kib, *rss.values(), 0)
        self.peak_redis_bytes = max(self.peak_redis_bytes, int(self._redis.info("memory")["used_memory"]))

    def tenth_rates(self) -> list[float]:
        """Reports/s over each tenth of the delivered users, from the first reading at or past its end."""
        if not self.readings:
            return []
        total = self.readings[-1][1]
        rates, start_t, start_n = [], 0.0, 0
        for tenth in range(1, TENTHS + 1):
            mark = total * tenth // TENTHS
            t, n = next((t, n) for t, n in self.readings if n >= mark)
            rates.append((n - start_n) / (t - start_t) if t > start_t else 0.0)
            start_t, start_n = t, n
        return rates

    def describe(self) -> str:
        rates = self.tenth_rates()
        # The first tenth holds the pools' warm-up and the walk's first pages; the rest should be flat.
        steady = rates[1:]
        spread = f" (2nd to last tenth: {min(steady):,.0f} to {max(steady):,.0f})" if steady else ""
        return (
            f"\n            reports/s by tenth of the users: {' '.join(f'{r:,.0f}' for r in rates)}{spread}"
            f"\n            peak RSS: bulk pool {self.peak_pool_kib / 1024:,.0f} MiB in all, largest process "
            f"{self.peak_process_kib / 1024:,.0f} MiB; redis-server used_memory peak "
            f"{self.peak_redis_bytes / 2**20:,.1f} MiB (sampled every {MEMORY_EVERY_SECONDS:.0f} s)"
        )


#: Each table's size with its partitions (a partitioned table's own is none), TOAST included.
SIZES = """
SELECT c.relname,
       sum(pg_table_size(t.relid))::bigint AS data,
       sum(pg_indexes_size(t.relid))::bigint AS indexes
FROM pg_class c CROSS JOIN LATERAL pg_partition_tree(c.oid) t
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
GROUP BY c.relname
ORDER BY 2 + 3 DESC
"""


def table_sizes(url: str, smallest_bytes: int = 1 << 20) -> str:
    """The database's size, and each table's of at least ``smallest_bytes``: data (with TOAST) + indexes."""
    with pg_connect(url) as connection:
        rows = connection.execute(SIZES).fetchall()
        (database,) = connection.execute("SELECT pg_database_size(current_database())").fetchone() or (0,)
    shown = ", ".join(
        f"{name} {data / 2**20:,.0f} + {indexes / 2**20:,.0f}"
        for name, data, indexes in rows
        if data + indexes >= smallest_bytes
    )
    return f"\n            PostgreSQL MiB, data + indexes: {shown}; database in all {database / 2**20:,.0f}"
