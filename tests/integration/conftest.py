"""Helpers for integration tests: a real Redis broker, a recording queue, triggering and walking."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pytest
import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reports import partitions
from reports.clock import utcnow
from reports.fanout import runs
from reports.fanout.coordinator import SliceOutcome, walk_slice
from reports.jobs import BUILD_REPORT, ActorSpec, ReportJob
from reports.models import ReportItem
from reports.periods import Period
from reports.queue import InMemoryQueue, Queue
from reports.settings import Settings
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for

PERIOD = Period.parse("2026-10")


def run_together(*calls: Callable[[], object], timeout: float = 60) -> None:
    """Run ``calls`` in threads released at the same instant; re-raise the first failure."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=10)
            call()
        except BaseException as e:  # noqa: BLE001 - re-raised by the calling thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a concurrent call did not finish"
    if errors:
        raise errors[0]


@pytest.fixture
def broker(settings: Settings) -> Iterator[RedisBroker]:
    """The project's real Redis broker, in the test's own namespace."""
    built = build_broker(settings)
    yield built
    built.close()


class RecordingQueue:
    """A queue that remembers who it was sent jobs for, and really enqueues them on ``broker``
    (``None``: in memory)."""

    def __init__(self, broker: RedisBroker | None = None, *, pause_seconds: float = 0.0) -> None:
        self.queue: Queue = InMemoryQueue() if broker is None else queue_for(broker)
        #: Time spent "talking to the broker", so concurrent coordinators really overlap.
        self.pause_seconds = pause_seconds
        self.lock = threading.Lock()
        self.calls = 0
        self.user_ids: list[int] = []

    def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
        batch = list(payloads)
        jobs = [ReportJob.parse(spec.arguments(payload), {}) for payload in batch]
        with self.lock:
            self.calls += 1
            self.user_ids.extend(job.user_id for job in jobs)
        time.sleep(self.pause_seconds)
        return self.queue.send_jobs(spec, batch)

    def send_coordinator(self, walker: str, payload: Mapping[str, Any], *, delay_ms: int | None = None) -> None:
        self.queue.send_coordinator(walker, payload, delay_ms=delay_ms)

    def backlog(self, queue: str) -> int:
        return self.queue.backlog(queue)

    def enqueue_again(
        self, *, queue: str, actor: str, args: list[Any], kwargs: dict[str, Any], walker: str | None = None
    ) -> str:
        return self.queue.enqueue_again(queue=queue, actor=actor, args=args, kwargs=kwargs, walker=walker)


def make_partitions(sessions: sessionmaker[Session], *periods: Period | str) -> None:
    """Make the months' partitions, as their trigger would: for a test that writes a month's rows itself."""
    with sessions.begin() as session:
        for period in periods or (PERIOD,):
            partitions.ensure(session, period)


def trigger(sessions: sessionmaker[Session], settings: Settings, period: Period = PERIOD) -> None:
    with sessions.begin() as session:
        runs.trigger(session, period, template_version=settings.template_version, now=utcnow())


def walk_everything(
    sessions: sessionmaker[Session],
    settings: Settings,
    period: Period = PERIOD,
    queue: Queue | None = None,
) -> SliceOutcome:
    """Trigger ``period`` and walk every active user, enqueueing nowhere unless ``queue`` says so."""
    trigger(sessions, settings, period)
    outcome = walk_slice(
        sessions, period, queue or InMemoryQueue(), page_size=settings.plan_page_size, budget_seconds=60
    )
    assert outcome.planned
    return outcome


def queued_user_ids(settings: Settings, queue: str = BUILD_REPORT.queue) -> Counter[int]:
    """How many messages wait in Redis for each user id (decoded from the broker's own storage)."""
    client = redis.Redis.from_url(settings.broker_url)
    ids = client.lrange(f"{settings.broker_namespace}:{queue}", 0, -1)
    stored = client.hgetall(f"{settings.broker_namespace}:{queue}.msgs")
    counts: Counter[int] = Counter()
    for message_id in ids:
        message = Message.decode(stored[message_id])
        assert message.actor_name == BUILD_REPORT.name
        counts[ReportJob.parse(message.args, message.kwargs).user_id] += 1
    return counts


def item_user_ids(sessions: sessionmaker[Session], period: Period = PERIOD) -> Counter[int]:
    with sessions() as session:
        return Counter(session.scalars(select(ReportItem.user_id).where(ReportItem.period == str(period))))


def count_items(sessions: sessionmaker[Session], *conditions: Any, period: Period = PERIOD) -> int:
    with sessions() as session:
        return (
            session.scalar(
                select(func.count()).select_from(ReportItem).where(ReportItem.period == str(period), *conditions)
            )
            or 0
        )
