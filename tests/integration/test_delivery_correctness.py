"""The delivery path stays right where it meets the breaker, the database and the dead letters.

Through ``pipeline.run`` on a real database (SQLite and PostgreSQL unless a test says
otherwise), a real SMTP server and a real Redis; the mailers here wrap the real SMTP mailer
only to do something at the moment a send happens (another connection taking a lock, Redis
going wrong), as a concurrent process would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from email.message import EmailMessage
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from reports import items
from reports.clock import utcnow
from reports.database import create_db_engine, session_factory
from reports.dead_message import DeadMessage
from reports.delivery import pipeline
from reports.delivery.breaker import CircuitBreaker, State, mail_breaker_name
from reports.delivery.mail.backend import Mailer, build_mailer
from reports.errors import ConfigurationError, PermanentError, SendUnconfirmed
from reports.failures import dead_letters
from reports.fanout import progress
from reports.jobs import BUILD_REPORT, ReportJob
from reports.models import Delivery, DeliveryState, ItemState, ReportItem
from reports.settings import Settings
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for
from tests.integration.conftest import PERIOD, trigger, walk_everything
from tests.support.databases import load_users
from tests.support.waiting import wait_until

THRESHOLD = 5
COOLDOWN_MS = 30_000

postgresql_only = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

#: In-process sends: room for the claim and the render (tests/conftest.py says why).
pytestmark = pytest.mark.claim_lease_seconds(10)


# --- Fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture
def mail_settings(settings: Settings, smtp_server) -> Settings:  # type: ignore[no-untyped-def]
    return replace(settings, smtp_url=smtp_server.url)


@pytest.fixture
def context(mail_settings: Settings, sessions: sessionmaker[Session]) -> pipeline.Context:
    return pipeline.Context(settings=mail_settings, sessions=sessions, mailer=build_mailer(mail_settings))


@pytest.fixture
def population(settings: Settings, sessions: sessionmaker[Session]):  # type: ignore[no-untyped-def]
    """Ten users (5 and 10 inactive, so they have no item), the active ones planned for the period."""
    loaded = load_users(sessions, count=10)
    walk_everything(sessions, settings)
    return loaded


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def breaker_on(client: redis.Redis, name: str = "test:breaker", **options: int) -> CircuitBreaker:
    """The mail breaker as a worker builds it on ``client`` (``options`` override the tests' own)."""
    return CircuitBreaker(
        client,
        name=name,
        **{"failure_threshold": THRESHOLD, "window_ms": 10_000, "cooldown_ms": COOLDOWN_MS, "probe_timeout_ms": 5_000}
        | options,
    )


@pytest.fixture
def breaker(redis_client: redis.Redis, broker_namespace: str) -> CircuitBreaker:
    """The mail breaker as a worker builds it, on the test's namespace."""
    return breaker_on(redis_client, mail_breaker_name(broker_namespace))


def millis(moment: datetime) -> int:
    return int((moment - datetime(1970, 1, 1)).total_seconds() * 1000)


def open_past_its_cool_down(breaker: CircuitBreaker) -> None:
    """Open the breaker long enough ago that its next ``allow`` makes the caller the half-open probe."""
    opened = millis(utcnow()) - 2 * COOLDOWN_MS
    for _ in range(THRESHOLD):
        state = breaker.record_failure(opened, token=uuid.uuid4().hex)
    assert state is State.OPEN


def job(settings: Settings, user_id: int) -> ReportJob:
    return ReportJob(PERIOD, user_id, settings.template_version)


def item(sessions: sessionmaker[Session], user_id: int) -> ReportItem:
    with sessions() as session:
        found = session.get(ReportItem, (str(PERIOD), user_id))
        assert found is not None
        return found


def claim(sessions: sessionmaker[Session], user_id: int) -> Delivery:
    with sessions() as session:
        found = session.get(Delivery, (str(PERIOD), user_id))
        assert found is not None
        return found


def counts(sessions: sessionmaker[Session]) -> progress.Progress:
    with sessions() as session:
        return progress.count(session, PERIOD)


def dead_copy(settings: Settings, user_id: int) -> DeadMessage:
    """A copy of ``build_report`` for (PERIOD, user) that ran out of retries."""
    now_ms = millis(utcnow())
    return DeadMessage(
        message_id=f"copy-{uuid.uuid4().hex}",
        actor=BUILD_REPORT.name,
        queue=BUILD_REPORT.queue,
        args=BUILD_REPORT.arguments(job(settings, user_id).payload()),
        kwargs={},
        attempts=26,
        reason="retries_exhausted",
        error_class="ProviderUnavailable",
        error_message="SMTP provider unreachable",
        traceback="",
        first_failed_ms=now_ms - 60_000,
        died_ms=now_ms,
    )


def record_dead(sessions: sessionmaker[Session], dead: DeadMessage) -> bool:
    with sessions.begin() as session:
        return dead_letters.record(session, dead)


class AfterSend:
    """The real mailer, and something another process does at the moment of a send."""

    def __init__(self, mailer: Mailer, *, before=None, after=None) -> None:  # type: ignore[no-untyped-def]
        self.mailer, self.before, self.after = mailer, before, after

    def send(self, message: EmailMessage, *, recipient: str) -> None:
        if self.before is not None:
            self.before()
        self.mailer.send(message, recipient=recipient)
        if self.after is not None:
            self.after()


class RowLock:
    """Another connection holding ``SELECT … FOR UPDATE`` on one report item for ``seconds``."""

    def __init__(self, engine: Engine, user_id: int, seconds: float) -> None:
        self.engine, self.user_id, self.seconds = engine, user_id, seconds
        self.taken = threading.Event()
        self.released_at: datetime | None = None
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        with self.engine.connect() as connection:
            transaction = connection.begin()
            connection.execute(
                text("SELECT user_id FROM report_items WHERE period = :p AND user_id = :u FOR UPDATE"),
                {"p": str(PERIOD), "u": self.user_id},
            )
            self.taken.set()
            time.sleep(self.seconds)
            self.released_at = utcnow()
            transaction.commit()

    def start(self) -> None:
        self._thread.start()
        assert self.taken.wait(10), "the other connection did not get the row lock"

    def join(self) -> None:
        if self._thread.is_alive() or self.taken.is_set():
            self._thread.join(timeout=30)
        assert not self._thread.is_alive()


@pytest.fixture
def other_connection(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[Engine]:
    engine = create_db_engine(settings.database_url)
    yield engine
    engine.dispose()


# --- 1. The breaker is asked only once the database says there is something to send ----------


def test_a_message_for_an_item_already_delivered_leaves_the_half_open_probe_to_a_real_send(
    settings, sessions, context, smtp_server, population, breaker, redis_client
):
    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED
    open_past_its_cool_down(breaker)
    before = redis_client.hgetall(f"{breaker.name}:state")
    guarded = replace(context, breaker=breaker)

    assert pipeline.run(guarded, job(settings, 3)) == pipeline.Outcome.ALREADY_DONE

    assert breaker.state() is State.OPEN, "a message with nothing to send took the probe"
    assert redis_client.hgetall(f"{breaker.name}:state") == before
    # The probe's slot is still free: the next message that does send is the probe, and closes it.
    assert pipeline.run(guarded, job(settings, 4)) == pipeline.Outcome.DELIVERED
    assert breaker.state() is State.CLOSED
    assert {user: len(messages) for user, messages in smtp_server.by_user().items()} == {3: 1, 4: 1}


def test_a_message_for_a_user_who_turned_inactive_leaves_the_half_open_probe_untouched(
    settings, sessions, context, smtp_server, population, breaker, redis_client
):
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET active = :no WHERE id = 3"), {"no": False})
    open_past_its_cool_down(breaker)
    before = redis_client.hgetall(f"{breaker.name}:state")

    assert pipeline.run(replace(context, breaker=breaker), job(settings, 3)) == pipeline.Outcome.SKIPPED

    assert breaker.state() is State.OPEN
    assert redis_client.hgetall(f"{breaker.name}:state") == before
    assert smtp_server.messages == []


# --- 2. A send that happened is recorded whatever the breaker's Redis says afterwards -----------


def test_a_probe_that_was_sent_is_recorded_even_when_the_breaker_cannot_be_told_of_its_success(
    settings, sessions, context, smtp_server, population, breaker, redis_client
):
    open_past_its_cool_down(breaker)
    # Right after the permit, the breaker's state key turns into something its scripts cannot
    # read (WRONGTYPE): telling it about the probe's success fails in Redis.
    spoiled = AfterSend(context.mailer, before=lambda: redis_client.set(f"{breaker.name}:state", "x"))
    probing = replace(context, breaker=breaker, mailer=spoiled)

    assert pipeline.run(probing, job(settings, 7)) == pipeline.Outcome.DELIVERED

    assert len(smtp_server.by_user()[7]) == 1
    assert len(smtp_server.messages) == 1
    assert item(sessions, 7).state == ItemState.DELIVERED
    assert claim(sessions, 7).state == DeliveryState.SENT
    # And a copy of the message sends nothing more.
    assert pipeline.run(context, job(settings, 7)) == pipeline.Outcome.ALREADY_DONE
    assert len(smtp_server.messages) == 1


# --- 3. The record of a send outlasts a database that refuses for a while ------------------------


@postgresql_only
def test_a_send_is_recorded_when_the_database_refuses_for_seconds_after_the_providers_250(
    settings, sessions, mail_settings, smtp_server, population, other_connection
):
    engine = create_db_engine(settings.database_url)

    @event.listens_for(engine, "connect")
    def _short_lock_timeout(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        cursor.execute("SET lock_timeout = '200ms'")
        cursor.close()
        dbapi_connection.commit()

    lock = RowLock(other_connection, user_id=7, seconds=3.0)
    mailer = AfterSend(build_mailer(mail_settings), after=lock.start)
    impatient = pipeline.Context(settings=mail_settings, sessions=session_factory(engine), mailer=mailer)
    try:
        started = time.monotonic()
        outcome = pipeline.run(impatient, job(settings, 7))
        elapsed = time.monotonic() - started
    finally:
        lock.join()
        engine.dispose()

    assert outcome == pipeline.Outcome.DELIVERED
    assert elapsed >= 2.5, "the record did not wait for the lock: was it refused at all?"
    assert item(sessions, 7).state == ItemState.DELIVERED
    assert claim(sessions, 7).state == DeliveryState.SENT
    assert len(smtp_server.by_user()[7]) == 1


# --- 3b. A send the provider never answered keeps its claim to the end of the lease --------------


def test_a_send_the_provider_kept_without_answering_in_time_is_not_sent_again_before_its_lease_ends(
    settings, sessions, mail_settings, smtp_server, population
):
    short = replace(mail_settings, smtp_timeout_seconds=1, claim_lease_seconds=3)
    context = pipeline.Context(settings=short, sessions=sessions, mailer=build_mailer(short))
    # The provider keeps the message and answers the final "." after the send's deadline.
    smtp_server.handler.answer_delay_seconds = 2
    with pytest.raises(SendUnconfirmed):
        pipeline.run(context, job(settings, 7))
    smtp_server.handler.answer_delay_seconds = 0

    # The retry that follows at once finds the claim still held: it waits for the lease, mailing nothing.
    retry = pipeline.run(context, job(settings, 7))
    assert (retry.is_deferred, len(smtp_server.by_user()[7])) == (True, 1)
    assert 0.5 < retry.delay_seconds <= short.claim_lease_seconds
    assert item(sessions, 7).state == ItemState.PENDING

    # Once the lease ends a copy sends again, with the same Message-ID: the one duplicate window.
    time.sleep(retry.delay_seconds + 0.2)
    assert pipeline.run(context, job(settings, 7)) == pipeline.Outcome.DELIVERED
    assert [m["Message-ID"] for m in smtp_server.by_user()[7]] == [f"<report.{PERIOD}.7@reports.test>"] * 2
    assert item(sessions, 7).state == ItemState.DELIVERED


# --- 4. The lease is counted from when the row lock is granted ------------------------------------


@postgresql_only
def test_the_claims_lease_starts_when_the_item_lock_is_granted_not_when_the_job_started_waiting(
    settings, sessions, context, smtp_server, population, other_connection
):
    lock = RowLock(other_connection, user_id=7, seconds=2.0)
    lock.start()
    try:
        outcome = pipeline.run(context, job(settings, 7))
    finally:
        lock.join()

    assert outcome == pipeline.Outcome.DELIVERED

    assert lock.released_at is not None
    tolerance = timedelta(seconds=0.2)
    delivered = claim(sessions, 7)
    assert delivered.claimed_at >= lock.released_at - tolerance, (
        f"claimed at {delivered.claimed_at}, the lock was released at {lock.released_at}"
    )
    lease = timedelta(seconds=settings.claim_lease_seconds)
    assert delivered.lease_expires_at - lease >= lock.released_at - tolerance
    assert len(smtp_server.messages) == 1


def test_a_copy_on_a_worker_whose_clock_runs_ahead_cannot_take_over_a_live_claim(
    settings, sessions, context, smtp_server, population
):
    lease = settings.claim_lease_seconds
    ahead = replace(context, clock=lambda: utcnow() + timedelta(seconds=lease + 40))
    copies: list[object] = []

    def run_copy_ahead() -> None:
        copies.append(pipeline.run(ahead, job(settings, 7)))

    # While this copy sends, a copy on a worker whose clock is past the lease's end runs.
    sending = replace(context, mailer=AfterSend(context.mailer, before=run_copy_ahead))
    assert pipeline.run(sending, job(settings, 7)) == pipeline.Outcome.DELIVERED

    assert len(smtp_server.messages) == 1
    assert claim(sessions, 7).state == DeliveryState.SENT
    [held] = copies
    assert isinstance(held, pipeline.Outcome) and held.is_deferred and held.delay_seconds <= lease


# --- 4b. The lease is checked last, after every call that can block --------------------------------


@contextmanager
def stopped(client: redis.Redis) -> Iterator[None]:
    """The redis-server behind ``client`` paused (SIGSTOP), as a stalled host leaves it; resumed after."""
    pid = int(client.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_copy_whose_breaker_call_stalls_past_its_lease_sends_nothing_once_redis_answers(
    settings, sessions, mail_settings, smtp_server, population, private_redis
):
    short = replace(mail_settings, smtp_timeout_seconds=1, claim_lease_seconds=3)
    shared = redis.Redis.from_url(private_redis)  # as the workers build it: no socket timeout

    # Another worker read "closed" a moment ago, so its next sends do not ask Redis.
    fresh = breaker_on(shared, state_cache_ms=60_000)
    assert fresh.allow(millis(utcnow())).allowed
    stalling = pipeline.Context(
        settings=short, sessions=sessions, mailer=build_mailer(short), breaker=breaker_on(shared)
    )
    other = replace(stalling, breaker=fresh)
    outcome: list[object] = []

    def run_stalling_copy() -> None:
        try:
            outcome.append(pipeline.run(stalling, job(settings, 7)))
        except Exception as error:  # noqa: BLE001 - asserted below
            outcome.append(error)

    copy = threading.Thread(target=run_stalling_copy)
    with stopped(shared):
        # This copy claims, and its breaker (no reading yet) asks Redis, which does not answer.
        copy.start()
        wait_until(lambda: _claim_state(sessions, 7) == DeliveryState.CLAIMED, timeout=10, what="the first claim")
        time.sleep(short.claim_lease_seconds + 0.5)
        # Its lease has run out: another copy takes the claim over and sends.
        assert pipeline.run(other, job(settings, 7)) == pipeline.Outcome.DELIVERED
    copy.join(timeout=10)

    assert not copy.is_alive()
    assert [message["Message-ID"] for message in smtp_server.messages] == [f"<report.{PERIOD}.7@reports.test>"]
    assert item(sessions, 7).state == ItemState.DELIVERED
    # Told to start again: its retry finds the item delivered.
    assert [(result.is_deferred, result.delay_seconds) for result in outcome] == [(True, 0.0)]  # type: ignore[attr-defined]


def test_a_probe_turned_back_for_too_little_lease_hands_the_probe_to_the_next_send(
    settings, sessions, mail_settings, smtp_server, population, private_redis
):
    short = replace(mail_settings, smtp_timeout_seconds=1, claim_lease_seconds=3)
    shared = redis.Redis.from_url(private_redis)

    def worker() -> pipeline.Context:
        breaker = breaker_on(shared, probe_timeout_ms=60_000)
        return pipeline.Context(settings=short, sessions=sessions, mailer=build_mailer(short), breaker=breaker)

    stalling, other = worker(), worker()
    open_past_its_cool_down(stalling.breaker)  # type: ignore[arg-type]
    outcome: list[pipeline.Outcome] = []
    copy = threading.Thread(target=lambda: outcome.append(pipeline.run(stalling, job(settings, 7))))
    with stopped(shared):
        # This copy claims; its breaker call waits on Redis until less of the lease is left than a send needs.
        copy.start()
        wait_until(lambda: _claim_state(sessions, 7) == DeliveryState.CLAIMED, timeout=10, what="the claim")
        time.sleep(short.claim_lease_seconds - short.smtp_timeout_seconds)
    copy.join(timeout=10)
    assert [(result.is_deferred, result.delay_seconds) for result in outcome] == [(True, 0.0)]

    # The probe it was handed is the next send's: it goes now and closes the breaker, rather than
    # every send waiting out the probe timeout (a minute).
    assert pipeline.run(other, job(settings, 8)) == pipeline.Outcome.DELIVERED
    assert other.breaker.state() is State.CLOSED  # type: ignore[union-attr]
    assert [message["Message-ID"] for message in smtp_server.messages] == [f"<report.{PERIOD}.8@reports.test>"]


def _claim_state(sessions: sessionmaker[Session], user_id: int) -> str | None:
    with sessions() as session:
        found = session.get(Delivery, (str(PERIOD), user_id))
        return found.state if found else None


# --- 5. A delivery outranks a dead letter, whichever comes first ----------------------------------


def test_a_dead_letter_recorded_after_the_delivery_leaves_the_item_delivered(
    settings, sessions, context, smtp_server, population
):
    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED

    assert record_dead(sessions, dead_copy(settings, 3)) is True  # the operator still sees the letter

    assert item(sessions, 3).state == ItemState.DELIVERED
    seen = counts(sessions)
    assert (seen.delivered, seen.dead) == (1, 0)


def test_a_copy_that_was_sending_when_another_copy_died_makes_the_item_delivered(
    settings, sessions, context, smtp_server, population
):
    # While this copy is sending, another copy of its message is dead-lettered.
    mailer = AfterSend(context.mailer, after=lambda: record_dead(sessions, dead_copy(settings, 3)))

    assert pipeline.run(replace(context, mailer=mailer), job(settings, 3)) == pipeline.Outcome.DELIVERED

    assert item(sessions, 3).state == ItemState.DELIVERED
    assert claim(sessions, 3).state == DeliveryState.SENT
    seen = counts(sessions)
    assert (seen.delivered, seen.dead) == (1, 0)
    assert len(smtp_server.messages) == 1


def test_finishing_a_dead_item_as_delivered_makes_it_delivered(settings, sessions, population):
    assert record_dead(sessions, dead_copy(settings, 3)) is True
    assert item(sessions, 3).state == ItemState.DEAD

    with sessions.begin() as session:
        assert items.finish(session, PERIOD, 3, ItemState.DELIVERED, now=utcnow()) is True

    assert item(sessions, 3).state == ItemState.DELIVERED
    seen = counts(sessions)
    assert (seen.delivered, seen.dead) == (1, 0)


def test_a_dead_letter_for_an_item_whose_email_was_sent_does_not_mark_it_dead(
    settings, sessions, context, smtp_server, population
):
    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED
    # The item reads pending again (as a reopened item does), while its delivery stays sent.
    with sessions.begin() as session:
        session.execute(text("UPDATE report_items SET state = 'pending' WHERE user_id = 3"))

    record_dead(sessions, dead_copy(settings, 3))

    assert item(sessions, 3).state == ItemState.PENDING, "an item whose email went out was marked dead"
    # The next copy finds the delivery sent and makes the item say so, without an email.
    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.ALREADY_DONE
    assert item(sessions, 3).state == ItemState.DELIVERED
    assert len(smtp_server.messages) == 1
    seen = counts(sessions)
    assert (seen.delivered, seen.dead) == (1, 0)


# --- 6. The backlog counts what is delayed and what live workers hold -----------------------------


@pytest.fixture
def bulk_broker(redis_url: str, broker_namespace: str, tmp_path: Path) -> Iterator[RedisBroker]:
    """The project's broker on the test's namespace (no database needed)."""
    built = build_broker(Settings(var_dir=tmp_path / "var", broker_url=redis_url, broker_namespace=broker_namespace))
    yield built
    built.close()


def bulk_message(user_id: int) -> dramatiq.Message:
    payload = ReportJob(PERIOD, user_id, "v1").payload()
    return dramatiq.Message(
        queue_name=BUILD_REPORT.queue,
        actor_name=BUILD_REPORT.name,
        args=BUILD_REPORT.arguments(payload),
        kwargs={},
        options={},
    )


def fetched_by(
    client: redis.Redis, namespace: str, worker_id: str, *, heartbeat_ms: int, ready: int, delayed: int
) -> None:
    """A worker that fetched ``ready`` messages of ``bulk`` and ``delayed`` of ``bulk.DQ``, laid out
    as the Redis broker does: its heartbeat, its acks sets, and the messages still in the queues' hashes."""
    queue = BUILD_REPORT.queue
    client.zadd(f"{namespace}:__heartbeats__", {worker_id: heartbeat_ms})
    for name, n in ((queue, ready), (f"{queue}.DQ", delayed)):
        for user_id in range(n):
            message_id = str(uuid.uuid4())
            client.hset(f"{namespace}:{name}.msgs", message_id, bulk_message(user_id).encode())
            client.sadd(f"{namespace}:__acks__.{worker_id}.{name}", message_id)


def test_the_backlog_counts_ready_delayed_and_held_messages(bulk_broker: RedisBroker) -> None:
    for user_id in range(6):
        bulk_broker.enqueue(bulk_message(user_id))
    for user_id in range(3):
        bulk_broker.enqueue(bulk_message(user_id), delay=60_000)
    # A worker's consumers hand out 3 ready messages, then 1 delayed one (its first on that
    # queue, which publishes at once what the process holds).
    ready = bulk_broker.consume(BUILD_REPORT.queue, prefetch=3, timeout=100)
    delayed = bulk_broker.consume(f"{BUILD_REPORT.queue}.DQ", prefetch=1, timeout=100)
    handed_out = [next(ready) for _ in range(3)] + [next(delayed)]
    assert None not in handed_out

    assert queue_for(bulk_broker).backlog(BUILD_REPORT.queue) == 9


def test_a_message_in_a_live_workers_ack_set_that_none_of_its_consumers_holds_is_not_in_the_backlog(
    bulk_broker: RedisBroker, redis_client: redis.Redis, broker_namespace: str
) -> None:
    # What a consumer Dramatiq dropped used to leave: nothing runs it while that process lives.
    bulk_broker.enqueue(bulk_message(1))
    fetched_by(
        redis_client, broker_namespace, f"worker-{uuid.uuid4()}", heartbeat_ms=millis(utcnow()), ready=2, delayed=3
    )

    assert queue_for(bulk_broker).backlog(BUILD_REPORT.queue) == 1


def test_a_dead_workers_messages_count_in_the_backlog_until_swept_and_once_after(
    bulk_broker: RedisBroker, redis_client: redis.Redis, broker_namespace: str, tmp_path: Path, redis_url: str
) -> None:
    bulk_broker.enqueue(bulk_message(1))
    stale = millis(utcnow()) - 10 * bulk_broker.heartbeat_timeout
    fetched_by(redis_client, broker_namespace, f"dead-{uuid.uuid4()}", heartbeat_ms=stale, ready=2, delayed=0)

    # Not swept yet: the dead worker's messages are still on their way (they will come back).
    assert queue_for(bulk_broker).backlog(BUILD_REPORT.queue) == 3

    # A broker call that runs maintenance puts them back on the queue: counted once, not lost.
    sweeping = RedisBroker(
        url=redis_url,
        namespace=broker_namespace,
        heartbeat_timeout=bulk_broker.heartbeat_timeout,
        maintenance_chance=1_000_000,
    )
    try:
        sweeping.enqueue(bulk_message(2))
    finally:
        sweeping.close()
    assert redis_client.llen(f"{broker_namespace}:{BUILD_REPORT.queue}") == 4, "the sweep did not run"
    assert queue_for(bulk_broker).backlog(BUILD_REPORT.queue) == 4


# --- 7. A message whose item is missing ---------------------------------------------------------


def test_a_message_for_a_user_the_unfinished_walk_has_not_reached_is_deferred(settings, sessions, context, smtp_server):
    load_users(sessions, count=10)
    trigger(sessions, settings)
    with sessions.begin() as session:
        session.execute(text("UPDATE period_runs SET cursor = 4"))

    deferred = pipeline.run(context, job(settings, 6))
    assert deferred.is_deferred and deferred.delay_seconds > 0

    # At or below the cursor the walk has been: an item missing there will never come.
    for walked in (3, 4):
        with pytest.raises(pipeline.UnknownItem):
            pipeline.run(context, job(settings, walked))
    assert smtp_server.messages == []


def test_before_the_walks_first_page_a_message_for_any_user_is_deferred(settings, sessions, context, smtp_server):
    load_users(sessions, count=3)
    with sessions.begin() as session:
        session.execute(
            text("INSERT INTO users (id, email, name, active) VALUES (-7, 'below@example.test', 'B', true)")
        )
    trigger(sessions, settings)  # no page recorded yet: no cursor

    # 0 and negative ids are users too: the walk has not reached them either.
    for user_id in (-7, 2):
        outcome = pipeline.run(context, job(settings, user_id))
        assert isinstance(outcome, pipeline.Outcome) and outcome.is_deferred, user_id
    assert smtp_server.messages == []


def test_a_message_for_a_user_without_an_item_in_a_planned_period_is_a_permanent_failure(
    settings, sessions, context, smtp_server, population
):
    for user_id in (5, 11):  # inactive when walked; beyond every user
        with pytest.raises(pipeline.UnknownItem) as unknown:
            pipeline.run(context, job(settings, user_id))
        assert isinstance(unknown.value, PermanentError)
    assert smtp_server.messages == []


# --- 8. A lease shorter than a whole send is refused at start-up -----------------------------------


def test_a_claim_lease_that_covers_the_whole_send_and_its_record_is_accepted_at_start_up(tmp_path: Path) -> None:
    accepted = Settings(var_dir=tmp_path, smtp_timeout_seconds=10, claim_lease_seconds=12)
    assert accepted.claim_lease_seconds == 12
    from_env = Settings.from_env({"VAR_DIR": str(tmp_path), "SMTP_TIMEOUT_SECONDS": "10", "CLAIM_LEASE_SECONDS": "12"})
    assert from_env.claim_lease_seconds == 12


@pytest.mark.parametrize(("timeout", "lease"), [(10, 11.9), (10, 10), (10, 5), (60, 30)])
def test_a_claim_lease_too_short_for_the_whole_send_is_refused_at_start_up(
    tmp_path: Path, timeout: float, lease: float
) -> None:
    with pytest.raises(ConfigurationError, match="CLAIM_LEASE_SECONDS"):
        Settings(var_dir=tmp_path, smtp_timeout_seconds=timeout, claim_lease_seconds=lease)
    with pytest.raises(ConfigurationError, match="CLAIM_LEASE_SECONDS"):
        Settings.from_env(
            {"VAR_DIR": str(tmp_path), "SMTP_TIMEOUT_SECONDS": str(timeout), "CLAIM_LEASE_SECONDS": str(lease)}
        )
