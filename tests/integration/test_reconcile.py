"""Reconcile against real databases: count a period, re-send what is stuck, exactly once per run."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reports import items
from reports.clock import utcnow
from reports.delivery import claims
from reports.delivery.breaker import CircuitBreaker, State, mail_breaker_name
from reports.errors import BadInput
from reports.fanout import reconcile as reconciling
from reports.fanout import runs
from reports.fanout.coordinator import walk_slice
from reports.fanout.reconcile import Reconciliation
from reports.jobs import BUILD_REPORT, COORDINATOR, ActorSpec, ReportJob
from reports.models import Delivery, ItemState, PeriodRun, ReportItem, RunState
from reports.periods import Period
from reports.queue import InMemoryQueue
from reports.settings import Settings
from reports.sql import server_now
from reports.worker.broker import build_broker, message_for
from reports.worker.queues import queue_for
from tests.integration.conftest import PERIOD, item_user_ids, queued_user_ids, run_together, trigger, walk_everything
from tests.integration.test_retention import waiting_on_a_lock
from tests.support.broker import queued_messages
from tests.support.databases import load_users, pg_connect
from tests.support.processes import free_port

STUCK_AFTER = timedelta(minutes=10)


class Recorder(InMemoryQueue):
    """An in-memory queue, read as the users and the coordinators it was sent."""

    @property
    def user_ids(self) -> list[int]:
        jobs = [ReportJob.parse(message.args, {}) for message in self.of(BUILD_REPORT)]
        assert all(job.period == PERIOD for job in jobs)
        return [job.user_id for job in jobs]

    @property
    def coordinators(self) -> list[dict[str, Any]]:
        return [dict(zip(COORDINATOR.fields, message.args, strict=True)) for message in self.of(COORDINATOR)]


def run_reconcile(
    sessions: sessionmaker[Session],
    recorder: Recorder,
    *,
    now: datetime,
    stuck_after: timedelta = STUCK_AFTER,
    period: Period = PERIOD,
) -> Reconciliation:
    return reconciling.reconcile(
        sessions,
        period,
        recorder,
        stuck_after=stuck_after,
        now=now,
    )


def later(minutes: float = 60) -> datetime:
    return utcnow() + timedelta(minutes=minutes)


def item(sessions: sessionmaker[Session], user_id: int) -> ReportItem:
    with sessions() as session:
        found = session.get(ReportItem, (str(PERIOD), user_id))
        assert found is not None
        return found


# --- stuck items are re-sent once ------------------------------------------------------------


def test_every_pending_item_untouched_past_the_threshold_is_re_enqueued_once(sessions, settings):
    population = load_users(sessions, count=30)
    walk_everything(sessions, settings)
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    assert sorted(recorder.user_ids) == population.active
    assert Counter(recorder.user_ids).most_common(1)[0][1] == 1
    active = len(population.active)
    assert found == Reconciliation(
        period=str(PERIOD),
        planned=True,
        active_users=active,
        items=active,
        active_without_item=0,
        finished=0,
        pending=active,
        requeued=active,
        waiting=0,
        coordinator_enqueued=False,
        walk_paused=False,
    )
    assert recorder.coordinators == []


def test_re_enqueuing_stamps_each_item_with_reconciles_now(sessions, settings):
    population = load_users(sessions, count=10)
    walk_everything(sessions, settings)
    now = later()

    run_reconcile(sessions, Recorder(), now=now)

    for user_id in population.active:
        stamped = item(sessions, user_id)
        assert (stamped.updated_at, stamped.enqueued_at) == (now, now)
        assert stamped.state == ItemState.PENDING


def test_reconciling_again_at_the_same_moment_re_enqueues_nothing(sessions, settings):
    population = load_users(sessions, count=20)
    walk_everything(sessions, settings)
    now = later()
    first = Recorder()
    run_reconcile(sessions, first, now=now)
    assert sorted(first.user_ids) == population.active

    again = Recorder()
    found = run_reconcile(sessions, again, now=now)

    assert again.batches == []
    assert found.requeued == 0
    assert (found.pending, found.items) == (len(population.active), len(population.active))


def test_items_touched_within_the_threshold_are_not_re_enqueued(sessions, settings):
    load_users(sessions, count=20)
    walk_everything(sessions, settings)
    recorder = Recorder()

    # Five minutes from now, every item was touched (planned) less than ten minutes before.
    found = run_reconcile(sessions, recorder, now=later(minutes=5))

    assert recorder.batches == []
    assert found.requeued == 0
    assert found.pending == found.items > 0


def test_only_the_items_untouched_for_longer_than_the_threshold_are_re_enqueued(sessions, settings):
    population = load_users(sessions, count=20)
    walk_everything(sessions, settings)
    now = utcnow()
    old, fresh = population.active[::3], population.active[1::3]
    with sessions.begin() as session:
        session.execute(
            update(ReportItem)
            .where(ReportItem.user_id.in_(old))
            .values(updated_at=now - STUCK_AFTER - timedelta(seconds=1))
        )
        session.execute(
            update(ReportItem)
            .where(ReportItem.user_id.in_(fresh))
            .values(updated_at=now - STUCK_AFTER + timedelta(seconds=30))
        )
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=now)

    assert sorted(recorder.user_ids) == old
    assert found.requeued == len(old)


# --- delivery claims -------------------------------------------------------------------------


def run_out_lease(sessions: sessionmaker[Session], user_id: int) -> None:
    """End a claim's lease a second ago on the database's clock, the one leases are written on."""
    with sessions.begin() as session:
        session.execute(
            update(Delivery)
            .where(Delivery.period == str(PERIOD), Delivery.user_id == user_id)
            .values(lease_expires_at=server_now(-1))
        )


def test_an_item_with_a_live_delivery_claim_waits_until_its_lease_has_run_out(sessions, settings):
    population = load_users(sessions, count=12)
    walk_everything(sessions, settings)
    claimed_user = population.active[3]
    now = later()
    with sessions.begin() as session:
        claim = claims.take(session, PERIOD, claimed_user, message_id="in-flight", lease_seconds=180)
    assert claim is not None

    first = Recorder()
    found = run_reconcile(sessions, first, now=now)

    assert claimed_user not in first.user_ids
    assert sorted(first.user_ids) == [u for u in population.active if u != claimed_user]
    assert found.requeued == len(population.active) - 1
    # The claimed item was not stamped: it is still as the walk left it.
    assert item(sessions, claimed_user).updated_at < now - STUCK_AFTER

    # Once the lease has run out it is found; the others were stamped at `now`.
    run_out_lease(sessions, claimed_user)
    second = Recorder()
    found = run_reconcile(sessions, second, now=now + timedelta(minutes=5))

    assert second.user_ids == [claimed_user]
    assert found.requeued == 1


def test_a_claim_is_live_by_the_databases_clock_not_by_the_time_reconcile_is_given(sessions, settings):
    population = load_users(sessions, count=4)
    walk_everything(sessions, settings)
    live, ended = population.active[:2]
    with sessions.begin() as session:
        claims.take(session, PERIOD, live, message_id="m", lease_seconds=60)
        claims.take(session, PERIOD, ended, message_id="m", lease_seconds=0)
    recorder = Recorder()

    # A reconcile whose clock runs a day ahead still sees the running lease.
    run_reconcile(sessions, recorder, now=later(24 * 60))

    assert live not in recorder.user_ids
    assert ended in recorder.user_ids


def test_a_sent_delivery_with_a_still_pending_item_is_re_enqueued_for_the_consumer_to_finish(sessions, settings):
    population = load_users(sessions, count=4)
    walk_everything(sessions, settings)
    user_id = population.active[0]
    now = later()
    with sessions.begin() as session:
        claim = claims.take(session, PERIOD, user_id, message_id="m", lease_seconds=600)
        assert claim is not None
        assert claims.complete(session, claim, now=now - timedelta(seconds=50))
    recorder = Recorder()

    run_reconcile(sessions, recorder, now=now)

    # Sent but crashed before finishing the item: only a new message can move it to delivered.
    assert user_id in recorder.user_ids


# --- finished items --------------------------------------------------------------------------


def test_finished_items_are_never_re_enqueued(sessions, settings):
    population = load_users(sessions, count=20)
    walk_everything(sessions, settings)
    delivered, skipped, dead = population.active[:3]
    with sessions.begin() as session:
        at = utcnow()
        assert items.finish(session, PERIOD, delivered, ItemState.DELIVERED, now=at)
        assert items.finish(session, PERIOD, skipped, ItemState.SKIPPED, now=at)
        assert items.finish(session, PERIOD, dead, ItemState.DEAD, now=at, error="boom")
    pending = population.active[3:]

    for minutes in (60, 120, 24 * 60):
        recorder = Recorder()
        found = run_reconcile(sessions, recorder, now=later(minutes), stuck_after=timedelta(0))
        assert sorted(recorder.user_ids) == pending
        assert (found.finished, found.pending, found.items) == (3, len(pending), len(population.active))
        assert found.requeued == len(pending)

    for user_id, state in ((delivered, ItemState.DELIVERED), (skipped, ItemState.SKIPPED), (dead, ItemState.DEAD)):
        assert item(sessions, user_id).state == state


def test_a_period_with_every_item_finished_re_enqueues_nothing(sessions, settings):
    population = load_users(sessions, count=8)
    walk_everything(sessions, settings)
    with sessions.begin() as session:
        for user_id in population.active:
            items.finish(session, PERIOD, user_id, ItemState.DELIVERED, now=utcnow())
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later(), stuck_after=timedelta(0))

    assert recorder.batches == [] and recorder.coordinators == []
    assert (found.finished, found.pending, found.requeued) == (len(population.active), 0, 0)
    assert found.planned and not found.coordinator_enqueued


# --- the walk and the users ------------------------------------------------------------------


def test_an_unfinished_walk_gets_its_coordinator_re_enqueued(sessions, settings):
    population = load_users(sessions, count=40)
    trigger(sessions, settings)
    outcome = walk_slice(sessions, PERIOD, InMemoryQueue(), page_size=settings.plan_page_size, budget_seconds=0)
    assert not outcome.planned
    walked = sorted(item_user_ids(sessions))
    assert 0 < len(walked) < len(population.active)
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    assert recorder.coordinators == [{"period": str(PERIOD)}]
    assert found.coordinator_enqueued is True
    assert found.planned is False
    assert sorted(recorder.user_ids) == walked
    assert found.items == len(walked)
    assert found.active_without_item == len(population.active) - len(walked)
    assert found.active_users == len(population.active)


def test_a_cancelled_period_gets_neither_its_coordinator_nor_its_stuck_items_until_resumed(sessions, settings):
    load_users(sessions, count=40)
    trigger(sessions, settings)
    walk_slice(sessions, PERIOD, InMemoryQueue(), page_size=settings.plan_page_size, budget_seconds=0)
    with sessions.begin() as session:
        runs.cancel(session, PERIOD, now=utcnow())
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    # Each would only find the month cancelled; `reports trigger` resumes it.
    assert (found.coordinator_enqueued, found.requeued) == (False, 0)
    assert recorder.messages == []


def test_a_resume_whose_enqueue_failed_is_resumed_by_the_next_trigger(sessions, settings):
    population = load_users(sessions, count=6)
    walk_everything(sessions, settings)  # its messages were consumed while the month was cancelled
    with sessions.begin() as session:
        runs.cancel(session, PERIOD, now=utcnow())
    down = queue_for(build_broker(replace(settings, broker_url=f"redis://127.0.0.1:{free_port()}/0")))

    with pytest.raises(redis.ConnectionError):
        runs.trigger_and_enqueue(sessions, down, PERIOD, template_version="v1", now=utcnow())
    with sessions() as session:
        assert session.get(PeriodRun, str(PERIOD)).state == RunState.CANCELLED  # type: ignore[union-attr]

    queue = InMemoryQueue()
    again = runs.trigger_and_enqueue(sessions, queue, PERIOD, template_version="v1", now=utcnow())

    assert again.resumed
    assert sorted(m.args[1] for m in queue.messages if m.actor == BUILD_REPORT.name) == population.active


def test_a_resume_sends_an_item_whose_claim_an_unconfirmed_send_kept(sessions, settings):
    # The send got no reply, so its claim keeps the lease; its retry was consumed while the month
    # was cancelled. Its message waits the lease out; without it the item would wait for reconcile.
    population = load_users(sessions, count=4)
    walk_everything(sessions, settings)
    unconfirmed = population.active[1]
    with sessions.begin() as session:
        assert claims.take(session, PERIOD, unconfirmed, message_id="unconfirmed", lease_seconds=180) is not None
        runs.cancel(session, PERIOD, now=utcnow())

    queue = InMemoryQueue()
    resumed = runs.trigger_and_enqueue(sessions, queue, PERIOD, template_version="v1", now=utcnow())

    assert resumed.resumed
    assert sorted(m.args[1] for m in queue.messages if m.actor == BUILD_REPORT.name) == population.active


class _ResumedMeanwhile:
    """A queue whose send fails after another operator cancelled and resumed the month meanwhile."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
        with self.sessions.begin() as session:
            runs.cancel(session, PERIOD, now=utcnow())
        with self.sessions.begin() as session:
            assert runs.trigger(session, PERIOD, template_version="v1", now=utcnow()).resumed
        raise redis.ConnectionError("the broker went away")

    def backlog(self, queue: str) -> int:
        return 0


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_failed_resume_leaves_another_operators_resume_standing(sessions, settings):
    load_users(sessions, count=3)
    walk_everything(sessions, settings)
    with sessions.begin() as session:
        runs.cancel(session, PERIOD, now=utcnow())

    with pytest.raises(redis.ConnectionError):
        runs.trigger_and_enqueue(sessions, _ResumedMeanwhile(sessions), PERIOD, template_version="v1", now=utcnow())

    with sessions() as session:
        assert session.get(PeriodRun, str(PERIOD)).state == RunState.ACTIVE  # type: ignore[union-attr]


def test_a_triggered_period_with_no_items_yet_gets_its_coordinator_and_nothing_else(sessions, settings):
    population = load_users(sessions, count=5)
    trigger(sessions, settings)
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    assert recorder.coordinators == [{"period": str(PERIOD)}]
    assert recorder.batches == []
    assert (found.items, found.pending, found.requeued) == (0, 0, 0)
    assert found.active_without_item == len(population.active)


def test_a_planned_period_does_not_get_its_coordinator_again(sessions, settings):
    load_users(sessions, count=5)
    walk_everything(sessions, settings)
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    assert recorder.coordinators == []
    assert found.coordinator_enqueued is False


def test_active_users_added_after_the_walk_are_counted_without_an_item(sessions, settings):
    population = load_users(sessions, count=15)
    walk_everything(sessions, settings)
    newcomer, reactivated = 10_000, population.inactive[0]
    with sessions.begin() as session:
        session.execute(
            text("INSERT INTO users (id, email, name, active) VALUES (:id, :email, :name, :active)"),
            {"id": newcomer, "email": "late@example.test", "name": "Late", "active": True},
        )
        session.execute(text("UPDATE users SET active = :active WHERE id = :id"), {"id": reactivated, "active": True})
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    assert found.active_without_item == 2
    assert found.active_users == len(population.active) + 2
    assert found.items == len(population.active)
    assert sorted(recorder.user_ids) == population.active
    assert newcomer not in item_user_ids(sessions) and reactivated not in item_user_ids(sessions)


def test_a_never_triggered_period_is_bad_input(sessions, settings):
    load_users(sessions, count=5)
    recorder = Recorder()

    with pytest.raises(BadInput):
        run_reconcile(sessions, recorder, now=later(), period=Period.parse("2026-09"))

    assert recorder.batches == [] and recorder.coordinators == []


def test_another_periods_items_are_left_alone(sessions, settings):
    population = load_users(sessions, count=10)
    other = Period.parse("2026-09")
    walk_everything(sessions, settings, period=other)
    trigger(sessions, settings)
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    assert recorder.batches == []
    assert found.items == 0
    assert found.active_without_item == len(population.active)
    assert item_user_ids(sessions, other) == Counter(population.active)


# --- many stuck items ------------------------------------------------------------------------


def test_many_stuck_items_are_re_enqueued_once_each_in_chunks(sessions, settings, monkeypatch):
    monkeypatch.setattr(reconciling, "CHUNK", 100)
    population = load_users(sessions, count=2_500, inactive_every=10_000)
    trigger(sessions, settings)
    assert walk_slice(sessions, PERIOD, InMemoryQueue(), page_size=1_000, budget_seconds=60).planned
    recorder = Recorder()

    found = run_reconcile(sessions, recorder, now=later())

    assert len(population.active) == 2_500
    assert found.requeued == 2_500
    assert Counter(recorder.user_ids) == Counter(population.active)
    assert all(0 < len(batch) <= 100 for batch in recorder.batches)
    assert len(recorder.batches) == 25
    assert recorder.user_ids == sorted(recorder.user_ids)

    again = Recorder()
    assert run_reconcile(sessions, again, now=later()).requeued == 0
    assert again.batches == []


class SlowRecorder(Recorder):
    def send_jobs(self, spec: ActorSpec, payloads: Iterable[Mapping[str, Any]]) -> int:
        sent = super().send_jobs(spec, payloads)
        time.sleep(0.01)  # hold the transaction a moment, so the two really overlap
        return sent


def test_two_reconciles_at_once_re_enqueue_each_stuck_item_once_between_them(sessions, settings, monkeypatch):
    monkeypatch.setattr(reconciling, "CHUNK", 50)
    population = load_users(sessions, count=400, inactive_every=10_000)
    trigger(sessions, settings)
    assert walk_slice(sessions, PERIOD, InMemoryQueue(), page_size=500, budget_seconds=60).planned
    now = later()
    recorders = [SlowRecorder(), SlowRecorder()]

    def run(recorder: Recorder) -> None:
        reconciling.reconcile(sessions, PERIOD, recorder, stuck_after=STUCK_AFTER, now=now)

    run_together(*(lambda recorder=recorder: run(recorder) for recorder in recorders))

    sent = Counter(recorders[0].user_ids + recorders[1].user_ids)
    assert sent == Counter(population.active)


# --- real senders ----------------------------------------------------------------------------


def test_re_enqueued_items_are_really_in_redis_once_each(sessions, settings: Settings, broker):
    population = load_users(sessions, count=25)
    walk_everything(sessions, settings)  # the walk's own messages went nowhere: the broker "lost" them
    assert queued_messages(settings.broker_url, settings.broker_namespace, BUILD_REPORT.queue) == 0

    found = reconciling.reconcile(
        sessions,
        PERIOD,
        queue_for(broker),
        stuck_after=STUCK_AFTER,
        now=later(),
    )

    assert found.requeued == len(population.active)
    assert queued_user_ids(settings) == Counter(population.active)
    assert queued_messages(settings.broker_url, settings.broker_namespace, COORDINATOR.queue) == 0


def test_an_unfinished_walk_really_gets_a_plan_period_message(sessions, settings: Settings, broker):
    load_users(sessions, count=5)
    trigger(sessions, settings)

    found = reconciling.reconcile(
        sessions,
        PERIOD,
        queue_for(broker),
        stuck_after=STUCK_AFTER,
        now=later(),
    )

    assert found.coordinator_enqueued
    assert queued_messages(settings.broker_url, settings.broker_namespace, COORDINATOR.queue) == 1
    assert queued_messages(settings.broker_url, settings.broker_namespace, BUILD_REPORT.queue) == 0


def deferred_to_a_live_worker(settings: Settings, user_ids: list[int]) -> None:
    """Each user's message delayed and fetched by a worker that is alive (its heartbeat is fresh),
    as the Redis broker lays it out: its body in the delay queue's hash, its id in the worker's ack set."""
    client = redis.Redis.from_url(settings.broker_url)
    ns, worker = settings.broker_namespace, f"worker-{uuid.uuid4()}"
    client.zadd(f"{ns}:__heartbeats__", {worker: int(time.time() * 1000)})
    for user_id in user_ids:
        message = message_for(BUILD_REPORT, ReportJob(PERIOD, user_id, settings.template_version).payload())
        client.hset(f"{ns}:{BUILD_REPORT.queue}.DQ.msgs", message.message_id, message.encode())
        client.sadd(f"{ns}:__acks__.{worker}.{BUILD_REPORT.queue}.DQ", message.message_id)
    client.close()


def reconcile_against(sessions: sessionmaker[Session], settings: Settings, broker) -> Reconciliation:
    """Reconcile as the command does: the live broker tells what may still be on its way."""
    return runs.reconcile_through(
        sessions,
        queue_for(broker),
        PERIOD,
        redis_client=broker.client,
        namespace=settings.broker_namespace,
        stuck_after=STUCK_AFTER,
        now=later(),
    )


def test_an_item_whose_message_no_live_consumer_holds_is_stuck_not_in_flight(sessions, settings: Settings, broker):
    # What a consumer Dramatiq dropped used to leave in a live process's ack set: nothing runs it.
    population = load_users(sessions, count=4)
    walk_everything(sessions, settings)
    deferred_to_a_live_worker(settings, population.active)

    found = reconcile_against(sessions, settings, broker)

    assert (found.requeued, found.waiting) == (len(population.active), 0)
    assert queued_user_ids(settings) == Counter(population.active)


def test_an_item_whose_delayed_message_a_consumer_holds_is_in_flight(sessions, settings: Settings, broker):
    population = load_users(sessions, count=4)
    walk_everything(sessions, settings)
    message = message_for(BUILD_REPORT, ReportJob(PERIOD, population.active[0], settings.template_version).payload())
    broker.enqueue(message, delay=3_600_000)
    consumer = broker.consume(f"{BUILD_REPORT.queue}.DQ", prefetch=1, timeout=100)
    assert next(consumer) is not None  # held until due, as a worker's delay queue does

    found = reconcile_against(sessions, settings, broker)

    assert (found.requeued, found.waiting) == (0, len(population.active))


def test_reconcile_reads_items_it_did_not_change_unchanged(sessions, settings):
    population = load_users(sessions, count=6)
    walk_everything(sessions, settings)
    with sessions() as session:
        before = {
            row.user_id: (row.enqueued_at, row.updated_at, row.attempts) for row in session.scalars(select(ReportItem))
        }

    run_reconcile(sessions, Recorder(), now=later(minutes=5))

    with sessions() as session:
        after = {
            row.user_id: (row.enqueued_at, row.updated_at, row.attempts) for row in session.scalars(select(ReportItem))
        }
    assert after == before
    assert sorted(after) == population.active


def open_breaker(settings: Settings, client: redis.Redis, *, at_ms: int, cooldown_ms: int) -> None:
    """Open the mail breaker at ``at_ms`` as a worker does, after a provider failure."""
    breaker = CircuitBreaker(
        client,
        name=mail_breaker_name(settings.broker_namespace),
        failure_threshold=1,
        window_ms=10_000,
        cooldown_ms=cooldown_ms,
        probe_timeout_ms=1_000,
    )
    assert breaker.record_failure(at_ms, token="t") is State.OPEN


def test_an_open_breaker_holds_lost_items_back_only_for_its_cool_down(sessions, settings: Settings, broker):
    # The messages were lost (the broker flushed) while the provider was down: nothing is left to
    # send, so nothing moves the breaker on; past its cool-down it holds nothing back.
    population = load_users(sessions, count=4)
    walk_everything(sessions, settings)
    now_ms = int(time.time() * 1000)
    open_breaker(settings, broker.client, at_ms=now_ms, cooldown_ms=600_000)
    assert reconcile_against(sessions, settings, broker).requeued == 0

    broker.client.delete(f"{mail_breaker_name(settings.broker_namespace)}:state")
    open_breaker(settings, broker.client, at_ms=now_ms - 3_600_000, cooldown_ms=60_000)
    found = reconcile_against(sessions, settings, broker)

    assert (found.requeued, found.waiting) == (len(population.active), 0)
    assert queued_user_ids(settings) == Counter(population.active)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_reconcile_counts_the_users_without_holding_the_runs_lock_the_walk_needs(
    sessions, settings
) -> None:
    """Counting every active user takes about a second at a million; the walk takes the run's lock
    for each page, so the count must not hold it."""
    load_users(sessions, count=10)
    trigger(sessions, settings)
    with pg_connect(settings.database_url) as holder, pg_connect(settings.database_url) as walker:
        # The count of users without an item reads the suppressions: held here, it waits.
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE suppressions IN ACCESS EXCLUSIVE MODE")
        with ThreadPoolExecutor(1) as pool:
            counting = pool.submit(run_reconcile, sessions, Recorder(), now=later())
            deadline = time.monotonic() + 10
            while waiting_on_a_lock(sessions) == 0:
                assert time.monotonic() < deadline, "reconcile never waited for the suppressions"
                time.sleep(0.05)
            # What a page of the walk does first, without waiting: the run's lock is free.
            walker.execute("BEGIN")
            walker.execute("SET LOCAL lock_timeout = '1s'")
            try:
                locked = walker.execute(
                    "SELECT period FROM period_runs WHERE period = %s FOR UPDATE", (str(PERIOD),)
                ).fetchall()
            except psycopg.errors.LockNotAvailable:
                locked = []
            walker.execute("ROLLBACK")
            holder.execute("ROLLBACK")
            found = counting.result(timeout=30)
    assert locked == [(str(PERIOD),)], "the walk waited for the run's lock while reconcile counted users"
    assert (found.active_users, found.active_without_item) == (8, 8)
