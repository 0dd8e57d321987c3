"""The messages a worker process holds, and their snapshots in Redis (``{namespace}:__held__.{process}``),
which the backlog counts instead of the brokers' own figures.

The snapshot's layout, when it is written and in which direction its counts are off:
docs/explanation/architecture.md, "Inside a worker".
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis

logger = logging.getLogger(__name__)

#: Longest a changed (or unchanged, non-empty) snapshot waits before it is written, in seconds.
PUBLISH_INTERVAL_SECONDS = 1.0
#: How long a snapshot outlives its last write, in seconds: a process killed with ``kill -9``
#: stops counting this long after its last write at most.
SNAPSHOT_TTL_SECONDS = 5

#: Dramatiq's suffix for a queue's delay queue (``dramatiq.common.dq_name``).
DELAY_SUFFIX = ".DQ"


@dataclass(frozen=True)
class QueueHeld:
    """What the workers hold of one queue: how many messages, and the oldest waiting one's
    ``message_timestamp`` (milliseconds since the epoch; ``None`` when none waits)."""

    count: int = 0
    oldest_waiting_ms: int | None = None


class Held:
    """One message a consumer handed out, until it is released."""

    __slots__ = ("owner", "queue", "timestamp_ms", "waiting")

    def __init__(self, owner: object, queue: str, timestamp_ms: int, waiting: bool) -> None:
        self.owner = owner
        self.queue = queue
        self.timestamp_ms = timestamp_ms
        self.waiting = waiting


class HeldMessages:
    """The messages one process's consumers hold, shared by its consumer and worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[Held] = set()
        self._counts: Counter[str] = Counter()

    def hold(self, owner: object, queue: str, timestamp_ms: int, *, waiting: bool) -> Held:
        """Record a message ``owner`` (a consumer) handed out; ``waiting`` unless it is only held until due."""
        held = Held(owner, queue, timestamp_ms, waiting)
        with self._lock:
            self._held.add(held)
            self._counts[queue] += 1
        return held

    def start(self, held: Held) -> None:
        """A worker thread started the message: it no longer waits."""
        held.waiting = False

    def release(self, held: Held) -> None:
        """The message was acked or nacked, or its consumer closed; releasing it twice is harmless."""
        with self._lock:
            if held in self._held:
                self._held.remove(held)
                self._drop(held.queue)

    def release_all(self, owner: object) -> None:
        """Everything ``owner`` handed out: RabbitMQ requeues it when the consumer's connection closes."""
        with self._lock:
            mine = [held for held in self._held if held.owner is owner]
            self._held.difference_update(mine)
            for held in mine:
                self._drop(held.queue)

    def counts(self) -> dict[str, int]:
        """Messages held, by queue (only queues with some)."""
        with self._lock:
            return dict(self._counts)

    def snapshot(self) -> dict[str, QueueHeld]:
        with self._lock:
            held = list(self._held)
        return summarize(held)

    def _drop(self, queue: str) -> None:
        self._counts[queue] -= 1
        if self._counts[queue] <= 0:
            del self._counts[queue]


def summarize(held: Iterable[Held]) -> dict[str, QueueHeld]:
    """Count and oldest waiting timestamp by queue."""
    counts: Counter[str] = Counter()
    oldest: dict[str, int] = {}
    for message in held:
        counts[message.queue] += 1
        if message.waiting and message.timestamp_ms < oldest.get(message.queue, message.timestamp_ms + 1):
            oldest[message.queue] = message.timestamp_ms
    return {queue: QueueHeld(count, oldest.get(queue)) for queue, count in counts.items()}


def due(written: Mapping[str, int], counts: Mapping[str, int], *, seconds_since_write: float) -> bool:
    """Whether the process's snapshot should be written now.

    :param written: the counts by queue of the snapshot last written (empty if none is).
    :param counts: the counts by queue held now.
    """
    if any(count > 0 and not written.get(queue) for queue, count in counts.items()):
        return True
    if not counts and not written:
        return False
    return seconds_since_write >= PUBLISH_INTERVAL_SECONDS


def encode(snapshot: Mapping[str, QueueHeld]) -> str:
    return json.dumps({queue: [held.count, held.oldest_waiting_ms] for queue, held in sorted(snapshot.items())})


def decode(raw: bytes | str) -> dict[str, QueueHeld]:
    data: dict[str, list[Any]] = json.loads(raw)
    return {
        queue: QueueHeld(int(count), None if oldest is None else int(oldest)) for queue, (count, oldest) in data.items()
    }


def totals(snapshots: Iterable[Mapping[str, QueueHeld]]) -> dict[str, QueueHeld]:
    """The fleet's figures: counts added, the oldest waiting message of all."""
    merged: dict[str, QueueHeld] = {}
    for snapshot in snapshots:
        for queue, held in snapshot.items():
            before = merged.get(queue, QueueHeld())
            candidates = [t for t in (before.oldest_waiting_ms, held.oldest_waiting_ms) if t is not None]
            merged[queue] = QueueHeld(before.count + held.count, min(candidates) if candidates else None)
    return merged


def held_of(figures: Mapping[str, QueueHeld], queue: str) -> int:
    """Messages of ``queue`` held by workers, delayed ones (its ``.DQ``) included."""
    return figures.get(queue, QueueHeld()).count + figures.get(queue + DELAY_SUFFIX, QueueHeld()).count


def index_key(namespace: str) -> str:
    return f"{namespace}:__held__"


def snapshot_key(namespace: str, process: str) -> str:
    return f"{namespace}:__held__.{process}"


def read(client: redis.Redis, namespace: str) -> dict[str, QueueHeld]:
    """What the live worker processes hold, added up; forgets the processes whose snapshot expired."""
    processes = sorted(cast(set[bytes], client.smembers(index_key(namespace))))
    if not processes:
        return {}
    raws = cast(list[bytes | None], client.mget([snapshot_key(namespace, p.decode()) for p in processes]))
    gone = [process for process, raw in zip(processes, raws, strict=True) if raw is None]
    if gone:
        client.srem(index_key(namespace), *gone)
    return totals(decode(raw) for raw in raws if raw is not None)


class Publisher:
    """Writes one process's snapshot when :func:`due`; called by its consumer threads.

    :param ttl_seconds: how long a snapshot outlives its last write (:data:`SNAPSHOT_TTL_SECONDS`).
    :param clock: seconds from an arbitrary start (``time.monotonic``).
    """

    def __init__(
        self,
        held: HeldMessages,
        client: redis.Redis,
        *,
        namespace: str,
        process: str,
        ttl_seconds: int = SNAPSHOT_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.held = held
        self.client = client
        self.namespace = namespace
        self.process = process
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}
        self._written_at = clock()
        self._failing = False

    def publish_if_due(self, *, force: bool = False) -> None:
        # A consumer thread never waits for another's write: the one writing covers both.
        if not self._lock.acquire(blocking=False):
            return
        try:
            now = self.clock()
            counts = self.held.counts()
            if force or due(self._written, counts, seconds_since_write=now - self._written_at):
                self._write(counts)
                self._written_at = now
        finally:
            self._lock.release()

    def _write(self, counts: dict[str, int]) -> None:
        key, index = snapshot_key(self.namespace, self.process), index_key(self.namespace)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                if counts:
                    pipe.set(key, encode(self.held.snapshot()), ex=self.ttl_seconds)
                    pipe.sadd(index, self.process)
                else:
                    pipe.delete(key)
                    pipe.srem(index, self.process)
                pipe.execute()
        except redis.RedisError as error:
            # Consuming goes on without it: readers then count too few until Redis is back.
            if not self._failing:
                logger.warning("Could not publish the held messages' snapshot (%s).", type(error).__name__)
            self._failing = True
            return
        self._failing = False
        self._written = counts
