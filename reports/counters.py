"""Fleet-wide counters in Redis: the key and field layout every process writes and the exporter reads.

Each counter is one hash under ``<namespace>:metrics:<name>``; a field is the counter's label values
joined by :data:`SEP`, its value the count. Workers add to them, ``reports exporter`` reads them.
"""

from __future__ import annotations

import threading
from collections import Counter

import redis

#: Separates label values inside one Redis hash field.
SEP = "\x1f"

#: Upper bounds of the processing-time histogram's buckets, in seconds (+Inf is implied).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


#: Users whose locale (``locale``) or time zone (``time_zone``) was unknown, or whose language the
#: template version has no catalog for (``catalog``), by fact: the default was used.
FALLBACKS_COUNTER = "user_fallbacks"


def counter_key(namespace: str, name: str) -> str:
    return f"{namespace}:metrics:{name}"


def count(client: redis.Redis, namespace: str, name: str, *labels: str) -> None:
    """Add one to the fleet-wide counter ``name`` for these label values."""
    client.hincrby(counter_key(namespace, name), SEP.join(labels), 1)


class FallbackCounter:
    """How many users fell back to a default, by fact (``locale``, ``catalog``, ``time_zone``), since the last drain.

    Kept in the process and drained into :data:`FALLBACKS_COUNTER` by the worker's metrics flush,
    so that a fallback costs no Redis call of its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, fact: str, n: int = 1) -> None:
        with self._lock:
            self._counts[fact] += n

    def drain(self) -> dict[str, int]:
        with self._lock:
            counts, self._counts = dict(self._counts), Counter()
        return counts


#: The process's count of fallbacks.
FALLBACKS = FallbackCounter()
