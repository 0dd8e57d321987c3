"""The dead-letter store on SQLite and PostgreSQL: record, find, replay (bounded), purge, absorb .XQ."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.dead_message import DeadMessage
from reports.failures import dead_letters
from reports.fanout.coordinator import walk_slice
from reports.jobs import BUILD_REPORT, COORDINATOR
from reports.models import DeadLetter, ItemState, ReportItem
from reports.queue import InMemoryQueue
from reports.settings import Settings
from reports.worker.broker import message_for
from reports.worker.dead_letter_sink import BrokerDeadLetters, DeadLetterSink, absorb_broker_dead_letters
from reports.worker.queues import queue_for
from tests.integration.conftest import PERIOD, queued_user_ids, trigger, walk_everything
from tests.support.databases import load_users
from tests.support.processes import free_port
from tests.support.waiting import wait_until

#: A fixed "now" (naive UTC, as the schema stores it) and the same instant in epoch milliseconds.
NOW = datetime(2026, 11, 5, 12, 0, 0)
NOW_MS = int((NOW - datetime(1970, 1, 1)).total_seconds() * 1000)
REJECTED = ("MailRejected", "SMTP 550: 5.1.1 No such user")
DEFERRED = ("MailDeferred", "SMTP 451: 4.3.0 Try again later")


def report_dead(
    user_id: int,
    *,
    period: str = str(PERIOD),
    reason: str = "permanent",
    error: tuple[str, str] = REJECTED,
    message_id: str | None = None,
    attempts: int = 1,
    died_ms: int = NOW_MS,
    first_failed_ms: int | None = None,
) -> DeadMessage:
    return DeadMessage(
        message_id=message_id or f"msg-{period}-{user_id}-{reason}",
        actor=BUILD_REPORT.name,
        queue=BUILD_REPORT.queue,
        args=(period, user_id, "v1"),
        kwargs={},
        attempts=attempts,
        reason=reason,
        error_class=error[0],
        error_message=error[1],
        traceback=f'Traceback (most recent call last):\n  File "smtp.py", line 9\n{error[0]}: {error[1]}\n',
        first_failed_ms=first_failed_ms if first_failed_ms is not None else died_ms - 1_500,
        died_ms=died_ms,
    )


def record(sessions: sessionmaker[Session], dead: DeadMessage) -> bool:
    with sessions.begin() as session:
        return dead_letters.record(session, dead)


def letters(sessions: sessionmaker[Session], where: dead_letters.Filter | None = None) -> list[DeadLetter]:
    with sessions() as session:
        return list(dead_letters.find(session, where or dead_letters.Filter(include_replayed=True)))


def item(sessions: sessionmaker[Session], user_id: int, period: str = str(PERIOD)) -> ReportItem | None:
    with sessions() as session:
        return session.get(ReportItem, (period, user_id))


def planned(sessions: sessionmaker[Session], settings: Settings, count: int = 6) -> list[int]:
    """Users 1..count loaded and planned (items pending, nothing enqueued); returns the active ids."""
    population = load_users(sessions, count=count, inactive_every=5)
    walk_everything(sessions, settings)
    return population.active


def queued_messages(settings: Settings, queue: str = BUILD_REPORT.queue) -> list[Message[Any]]:
    client = redis.Redis.from_url(settings.broker_url)
    try:
        ids = client.lrange(f"{settings.broker_namespace}:{queue}", 0, -1)
        stored = client.hgetall(f"{settings.broker_namespace}:{queue}.msgs")
        return [Message.decode(stored[message_id]) for message_id in ids]
    finally:
        client.close()


# --- record ----------------------------------------------------------------------------------


def test_a_dead_letter_is_stored_with_everything_known_and_only_once(sessions, settings) -> None:
    active = planned(sessions, settings)
    user_id = active[0]
    dead = report_dead(
        user_id,
        attempts=3,
        reason="retries_exhausted",
        error=DEFERRED,
        first_failed_ms=NOW_MS - 61_234,
        died_ms=NOW_MS + 789,
    )

    assert record(sessions, dead) is True
    again = report_dead(user_id, attempts=9, reason="permanent", error=REJECTED, message_id=dead.message_id)
    assert record(sessions, again) is False

    [stored] = letters(sessions)
    assert stored.message_id == dead.message_id
    assert (stored.actor, stored.queue) == (BUILD_REPORT.name, BUILD_REPORT.queue)
    assert json.loads(stored.payload) == {"args": list(dead.args), "kwargs": {}}
    assert (stored.period, stored.user_id) == (str(PERIOD), user_id)
    assert (stored.attempts, stored.reason) == (3, "retries_exhausted")
    assert (stored.error_class, stored.error_message) == DEFERRED
    assert stored.traceback == dead.traceback
    assert stored.first_failed_at == NOW - timedelta(milliseconds=61_234)
    assert stored.died_at == NOW + timedelta(milliseconds=789)
    assert (stored.replayed_at, stored.replay_message_id) == (None, None)


def test_a_dead_report_job_makes_its_item_dead_with_the_error(sessions, settings) -> None:
    active = planned(sessions, settings)
    dead_user, other_user = active[0], active[1]

    record(sessions, report_dead(dead_user))

    dead_item = item(sessions, dead_user)
    assert dead_item is not None
    assert dead_item.state == ItemState.DEAD
    assert dead_item.last_error == "MailRejected: SMTP 550: 5.1.1 No such user"
    assert dead_item.finished_at == NOW
    other = item(sessions, other_user)
    assert other is not None and other.state == ItemState.PENDING


def test_a_dead_letter_never_undoes_a_delivered_item(sessions, settings) -> None:
    active = planned(sessions, settings)
    with sessions.begin() as session:
        session.execute(update(ReportItem).where(ReportItem.user_id == active[0]).values(state=ItemState.DELIVERED))

    assert record(sessions, report_dead(active[0])) is True

    delivered = item(sessions, active[0])
    assert delivered is not None and delivered.state == ItemState.DELIVERED and delivered.last_error is None


def test_a_late_copy_of_a_dead_message_leaves_the_item_its_replay_made_pending(sessions, settings) -> None:
    user_id = planned(sessions, settings)[0]
    dead = report_dead(user_id)
    assert record(sessions, dead) is True
    replayed = dead_letters.replay(sessions, InMemoryQueue(), dead_letters.Filter(), now=NOW, dry_run=False)
    assert replayed.items_reset == 1

    # A copy of the same message, back from a worker killed before its ack, dies again.
    assert record(sessions, report_dead(user_id, message_id=dead.message_id)) is False

    pending = item(sessions, user_id)
    assert pending is not None and pending.state == ItemState.PENDING


def test_a_stored_dead_letter_is_logged_though_redis_cannot_count_it(sessions, settings, caplog) -> None:
    user_id = planned(sessions, settings)[0]
    down = redis.Redis(port=free_port(), retry=None)
    sink = DeadLetterSink(sessions, alerts=None, on_stored=lambda dead: down.hincrby("dead", "letters", 1))

    sink(report_dead(user_id))  # raising would send the stored letter to .XQ as unstored

    assert [letter.user_id for letter in letters(sessions)] == [user_id]
    assert [r.getMessage()[:12] for r in caplog.records if r.levelname == "ERROR"] == ["Dead letter:"]
    assert "Dead-letter count skipped: Redis unreachable." in caplog.messages


MALFORMED = {
    "bad-period": (BUILD_REPORT.name, ("2026-13", 4, "v1"), {}),
    "bad-user-id": (BUILD_REPORT.name, ("2026-10", "four", "v1"), {}),
    "missing-field": (BUILD_REPORT.name, ("2026-10", 4), {}),
    "named": (BUILD_REPORT.name, (), {"period": "2026-10", "user_id": 4, "template_version": "v1"}),
    "unserialisable": (BUILD_REPORT.name, (), {"period": "2026-10", "user_id": 4, "extra": object()}),
    "plan-bad-period": (COORDINATOR.name, (["2026-10"],), {}),
    "unknown-actor": ("no_such_actor", (), {"anything": 1}),
}


def test_a_malformed_payload_is_stored_without_period_or_user(sessions, settings) -> None:
    active = planned(sessions, settings)

    for name, (actor, args, kwargs) in MALFORMED.items():
        dead = DeadMessage(
            message_id=name,
            actor=actor,
            queue="bulk",
            args=args,
            kwargs=kwargs,
            attempts=1,
            reason="permanent",
            error_class="InvalidPayload",
            error_message="does not parse",
            traceback="",
            first_failed_ms=NOW_MS,
            died_ms=NOW_MS,
        )
        assert record(sessions, dead) is True, name

    stored = {letter.message_id: letter for letter in letters(sessions)}
    assert set(stored) == set(MALFORMED)
    for name, (_, args, kwargs) in MALFORMED.items():
        assert (stored[name].period, stored[name].user_id) == (None, None), name
        assert json.loads(stored[name].payload)["args"] == list(args), name
        assert set(json.loads(stored[name].payload)["kwargs"]) == set(kwargs), name
    # No item was touched: user 4's item (if planned) is still pending.
    assert all(item(sessions, user_id).state == ItemState.PENDING for user_id in active)  # type: ignore[union-attr]


PLAN_DEAD = DeadMessage(
    message_id="plan-1",
    actor=COORDINATOR.name,
    queue=COORDINATOR.queue,
    args=("2026-10",),
    kwargs={},
    attempts=6,
    reason="retries_exhausted",
    error_class="OperationalError",
    error_message="db down",
    traceback="",
    first_failed_ms=NOW_MS,
    died_ms=NOW_MS,
)


def test_a_dead_plan_job_is_stored_with_its_period_and_no_user(sessions) -> None:
    assert record(sessions, PLAN_DEAD) is True
    [stored] = letters(sessions)
    assert (stored.period, stored.user_id, stored.actor) == ("2026-10", None, COORDINATOR.name)


def test_a_replayed_plan_job_walks_the_period_as_the_chain_its_run_names(sessions, settings) -> None:
    load_users(sessions, count=6)
    trigger(sessions, settings)
    dead = dataclasses.replace(PLAN_DEAD, args=(str(PERIOD),))
    assert record(sessions, dead) is True

    queue = InMemoryQueue()
    assert len(dead_letters.replay(sessions, queue, dead_letters.Filter(), now=NOW, dry_run=False).replayed) == 1

    [again] = queue.of(COORDINATOR)
    # As the actor runs it: a message that carries no chain token draws one of its own.
    walker = again.walker or "a chain of its own"
    walked = walk_slice(sessions, PERIOD, InMemoryQueue(), walker=walker, page_size=100, budget_seconds=60)
    assert walked.planned, "the replayed message ended as a superseded chain, walking nothing"


def test_a_dead_letter_whose_user_id_parses_but_exceeds_the_column_is_still_stored(sessions) -> None:
    """ReportJob.parse accepts any positive int (2**40 is a valid payload), so its dead letter must store."""
    dead = DeadMessage(
        message_id="huge-user",
        actor=BUILD_REPORT.name,
        queue=BUILD_REPORT.queue,
        args=("2026-10", 2**40, "v1"),
        kwargs={},
        attempts=1,
        reason="permanent",
        error_class="UnknownItem",
        error_message="no such item",
        traceback="",
        first_failed_ms=NOW_MS,
        died_ms=NOW_MS,
    )

    assert record(sessions, dead) is True
    [stored] = letters(sessions)
    assert json.loads(stored.payload)["args"][1] == 2**40


# --- find and get ----------------------------------------------------------------------------


@pytest.fixture
def catalogue(sessions) -> dict[str, int]:
    """Five dead letters of different periods and errors; returns their ids by name."""
    entries = {
        "oct-550": report_dead(1),
        "oct-451": report_dead(2, reason="retries_exhausted", error=DEFERRED, attempts=6),
        "sep-550": report_dead(3, period="2026-09"),
        "oct-550-replayed": report_dead(4),
        "malformed": DeadMessage(
            message_id="malformed",
            actor=BUILD_REPORT.name,
            queue="bulk",
            args=("soon",),
            kwargs={},
            attempts=1,
            reason="permanent",
            error_class="InvalidPayload",
            error_message="period is not a period",
            traceback="",
            first_failed_ms=NOW_MS,
            died_ms=NOW_MS,
        ),
    }
    for dead in entries.values():
        assert record(sessions, dead)
    with sessions.begin() as session:
        ids = {
            name: session.scalar(select(DeadLetter.id).where(DeadLetter.message_id == dead.message_id))
            for name, dead in entries.items()
        }
        session.execute(
            update(DeadLetter)
            .where(DeadLetter.id == ids["oct-550-replayed"])
            .values(replayed_at=NOW, replay_message_id="new-message")
        )
    return ids  # type: ignore[return-value]


FIND_CASES = [
    (dead_letters.Filter(), ["oct-550", "oct-451", "sep-550", "malformed"]),
    (dead_letters.Filter(include_replayed=True), ["oct-550", "oct-451", "sep-550", "oct-550-replayed", "malformed"]),
    (dead_letters.Filter(period="2026-10"), ["oct-550", "oct-451"]),
    (dead_letters.Filter(period="2026-10", include_replayed=True), ["oct-550", "oct-451", "oct-550-replayed"]),
    (dead_letters.Filter(period="2026-09"), ["sep-550"]),
    (dead_letters.Filter(period="2025-01"), []),
    (dead_letters.Filter(reason="550"), ["oct-550", "sep-550"]),
    (dead_letters.Filter(reason="No Such USER"), ["oct-550", "sep-550"]),
    (dead_letters.Filter(reason="maildeferred"), ["oct-451"]),
    (dead_letters.Filter(reason="EXHAUSTED"), ["oct-451"]),
    (dead_letters.Filter(reason="permanent"), ["oct-550", "sep-550", "malformed"]),
    (dead_letters.Filter(reason="InvalidPayload"), ["malformed"]),
    (dead_letters.Filter(period="2026-10", reason="550"), ["oct-550"]),
    (dead_letters.Filter(reason="421"), []),
]


def test_find_filters_by_period_reason_text_and_replayed(sessions, catalogue) -> None:
    # One database for the whole table: each case only reads.
    for where, expected in FIND_CASES:
        found = letters(sessions, where)

        assert [letter.id for letter in found] == [catalogue[name] for name in expected], where


def test_find_by_ids_and_with_a_limit(sessions, catalogue) -> None:
    wanted = (catalogue["sep-550"], catalogue["oct-550"], catalogue["oct-550-replayed"])

    assert [letter.id for letter in letters(sessions, dead_letters.Filter(ids=wanted))] == sorted(wanted[:2])
    with sessions() as session:
        assert len(list(dead_letters.find(session, dead_letters.Filter(), limit=2))) == 2


def test_get_returns_one_dead_letter_or_none(sessions, catalogue) -> None:
    with sessions() as session:
        letter = dead_letters.get(session, catalogue["oct-451"])
        assert letter is not None and letter.message_id == "msg-2026-10-2-retries_exhausted"
        assert dead_letters.get(session, max(catalogue.values()) + 100) is None


# --- replay ----------------------------------------------------------------------------------


def kill(sessions: sessionmaker[Session], user_ids: list[int], *, attempts: int = 3) -> list[int]:
    """Make these users' items dead after ``attempts`` tries, through record(); returns the letter ids."""
    with sessions.begin() as session:
        session.execute(update(ReportItem).where(ReportItem.user_id.in_(user_ids)).values(attempts=attempts))
    for user_id in user_ids:
        assert record(sessions, report_dead(user_id, attempts=attempts))
    return [letter.id for letter in letters(sessions)]


def test_replay_hands_each_dead_letter_to_the_queue_once_as_a_fresh_message(sessions, settings) -> None:
    active = planned(sessions, settings)
    ids = kill(sessions, active[:2])
    original_ids = {letter.message_id for letter in letters(sessions)}
    queue = InMemoryQueue()

    first = dead_letters.replay(sessions, queue, dead_letters.Filter(), now=NOW, dry_run=False)
    again = dead_letters.replay(sessions, queue, dead_letters.Filter(), now=NOW + timedelta(minutes=1), dry_run=False)

    assert (first.replayed, again.replayed) == (ids, [])
    assert [message.args[1] for message in queue.of(BUILD_REPORT)] == active[:2]
    assert not original_ids & {message.message_id for message in queue.messages}


def test_replay_enqueues_fresh_messages_and_resets_the_items(sessions, settings, broker) -> None:
    active = planned(sessions, settings)
    dead_users = active[:3]
    ids = kill(sessions, dead_users)
    original_ids = {letter.message_id for letter in letters(sessions)}

    outcome = dead_letters.replay(
        sessions, queue_for(broker), dead_letters.Filter(period=str(PERIOD)), now=NOW, dry_run=False
    )

    assert outcome.replayed == ids
    assert outcome.items_reset == 3
    messages = queued_messages(settings)
    assert len(messages) == 3
    assert queued_user_ids(settings) == {user_id: 1 for user_id in dead_users}
    replayed = {letter.user_id: letter for letter in letters(sessions)}
    for message in messages:
        user_id = message.args[1]
        assert message.actor_name == BUILD_REPORT.name
        assert message.queue_name == BUILD_REPORT.queue
        assert message.args == (str(PERIOD), user_id, "v1")
        assert message.kwargs == {}
        assert message.message_id not in original_ids  # a fresh message...
        assert "retries" not in message.options  # ...whose attempts start over
        assert "first_failed_ms" not in message.options
        assert replayed[user_id].replay_message_id == message.message_id
        assert replayed[user_id].replayed_at == NOW
    for user_id in dead_users:
        reset = item(sessions, user_id)
        assert reset is not None
        assert (reset.state, reset.attempts, reset.last_error, reset.finished_at) == (ItemState.PENDING, 0, None, None)
        assert reset.updated_at == NOW


def test_a_dry_run_replay_changes_nothing_and_enqueues_nothing(sessions, settings, broker) -> None:
    active = planned(sessions, settings)
    ids = kill(sessions, active[:2])

    outcome = dead_letters.replay(sessions, queue_for(broker), dead_letters.Filter(), now=NOW, dry_run=True)

    assert outcome.replayed == ids  # what would be replayed
    assert outcome.items_reset == 0
    assert queued_messages(settings) == []
    assert all(letter.replayed_at is None and letter.replay_message_id is None for letter in letters(sessions))
    for user_id in active[:2]:
        still = item(sessions, user_id)
        assert still is not None and (still.state, still.attempts) == (ItemState.DEAD, 3)


def test_replaying_the_same_filter_twice_replays_nothing_the_second_time(sessions, settings, broker) -> None:
    active = planned(sessions, settings)
    kill(sessions, active[:2])
    where = dead_letters.Filter(period=str(PERIOD))

    first = dead_letters.replay(sessions, queue_for(broker), where, now=NOW, dry_run=False)
    second = dead_letters.replay(sessions, queue_for(broker), where, now=NOW + timedelta(minutes=1), dry_run=False)

    assert len(first.replayed) == 2
    assert (second.replayed, second.items_reset) == ([], 0)
    assert len(queued_messages(settings)) == 2
    assert {letter.replayed_at for letter in letters(sessions)} == {NOW}


def test_replay_by_id_replays_only_those(sessions, settings, broker) -> None:
    active = planned(sessions, settings)
    ids = kill(sessions, active[:3])

    outcome = dead_letters.replay(
        sessions, queue_for(broker), dead_letters.Filter(ids=(ids[1],)), now=NOW, dry_run=False
    )

    assert outcome.replayed == [ids[1]]
    assert queued_user_ids(settings) == {active[1]: 1}
    assert [item(sessions, u).state for u in active[:3]] == [  # type: ignore[union-attr]
        ItemState.DEAD,
        ItemState.PENDING,
        ItemState.DEAD,
    ]


class SessionsWithInterlude:
    """The replay's sessionmaker, which runs queued actions just before its next transaction begins.

    A dead letter "recorded during the replay" must be committed while the replay is between
    transactions: SQLite has one writer, so recording it while the replay's transaction is open
    would wait for that very transaction.
    """

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.interludes: list[Callable[[], None]] = []

    def begin(self):  # type: ignore[no-untyped-def]
        while self.interludes:
            self.interludes.pop(0)()
        return self.sessions.begin()

    def __call__(self) -> Session:
        return self.sessions()


def test_replay_takes_a_bounded_snapshot_and_leaves_what_dies_meanwhile_to_the_next_one(
    sessions, settings, broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    active = planned(sessions, settings)
    snapshot = kill(sessions, active[:3])
    monkeypatch.setattr(dead_letters, "REPLAY_CHUNK", 2)  # so the replay has a next chunk to look into
    replay_sessions = SessionsWithInterlude(sessions)
    enqueue = broker.enqueue
    died_again: list[DeadMessage] = []

    def enqueue_and_die_at_once(message: dramatiq.Message[Any], *, delay: int | None = None) -> Any:
        sent = enqueue(message, delay=delay)
        if not died_again:
            # The first replayed message dies again straight away, recorded by "another worker".
            again = report_dead(message.args[1], message_id=message.message_id, died_ms=NOW_MS + 5_000)
            died_again.append(again)
            replay_sessions.interludes.append(lambda: record(sessions, again))
        return sent

    monkeypatch.setattr(broker, "enqueue", enqueue_and_die_at_once)
    first = dead_letters.replay(replay_sessions, queue_for(broker), dead_letters.Filter(), now=NOW, dry_run=False)  # type: ignore[arg-type]

    assert first.replayed == snapshot
    assert len(died_again) == 1
    new = letters(sessions, dead_letters.Filter())
    assert [letter.message_id for letter in new] == [died_again[0].message_id]  # stored, not replayed
    assert new[0].id > max(snapshot)
    assert len(queued_messages(settings)) == 3
    again_user = died_again[0].args[1]
    assert item(sessions, again_user).state == ItemState.DEAD  # type: ignore[union-attr]

    second = dead_letters.replay(
        sessions, queue_for(broker), dead_letters.Filter(), now=NOW + timedelta(hours=1), dry_run=False
    )

    assert second.replayed == [new[0].id]
    assert second.items_reset == 1
    assert len(queued_messages(settings)) == 4
    assert item(sessions, again_user).state == ItemState.PENDING  # type: ignore[union-attr]


# --- purge -----------------------------------------------------------------------------------


def test_purge_deletes_only_dead_letters_older_than_the_limit(sessions) -> None:
    day_ms = 86_400_000
    ages = {"40d": 40, "31d": 31, "29d": 29, "1d": 1}
    for name, days in ages.items():
        record(sessions, report_dead(7, message_id=name, died_ms=NOW_MS - days * day_ms))

    with sessions.begin() as session:
        purged = dead_letters.purge(session, older_than=timedelta(days=30), now=NOW)

    assert purged == 2
    assert sorted(letter.message_id for letter in letters(sessions)) == ["1d", "29d"]
    with sessions.begin() as session:
        assert dead_letters.purge(session, older_than=timedelta(days=30), now=NOW) == 0


# --- Dramatiq's own .XQ ----------------------------------------------------------------------


def xq_keys(client: redis.Redis, namespace: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{namespace}:*.XQ*"))


def test_messages_in_dramatiqs_xq_are_moved_into_the_store(sessions, settings, redis_url: str) -> None:
    active = planned(sessions, settings)
    namespace = settings.broker_namespace
    client = redis.Redis.from_url(redis_url)
    report = message_for(BUILD_REPORT, {"period": str(PERIOD), "user_id": active[0], "template_version": "v1"})
    report = report.copy(options={"redis_message_id": "r-1", "retries": 2, "first_failed_ms": NOW_MS - 9_000})
    plan = message_for(COORDINATOR, {"period": str(PERIOD)}).copy(options={"redis_message_id": "r-2"})
    # Exactly what Dramatiq's dispatch script writes on a nack.
    client.hset(f"{namespace}:bulk.XQ.msgs", "r-1", report.encode())
    client.zadd(f"{namespace}:bulk.XQ", {"r-1": NOW_MS})
    client.hset(f"{namespace}:default.XQ.msgs", "r-2", plan.encode())
    client.zadd(f"{namespace}:default.XQ", {"r-2": NOW_MS + 1_000})

    moved = absorb_broker_dead_letters(client, namespace, DeadLetterSink(sessions, alerts=None))

    assert moved == 2
    assert xq_keys(client, namespace) == []
    stored = {letter.message_id: letter for letter in letters(sessions)}
    assert set(stored) == {report.message_id, plan.message_id}
    from_bulk = stored[report.message_id]
    assert (from_bulk.reason, from_bulk.error_class, from_bulk.queue) == ("broker", "BrokerDeadLetter", "bulk")
    assert (from_bulk.period, from_bulk.user_id, from_bulk.attempts) == (str(PERIOD), active[0], 3)
    assert from_bulk.died_at == NOW
    assert from_bulk.first_failed_at == NOW - timedelta(seconds=9)
    assert item(sessions, active[0]).state == ItemState.DEAD  # type: ignore[union-attr]
    from_default = stored[plan.message_id]
    assert (from_default.reason, from_default.queue, from_default.actor) == ("broker", "default", COORDINATOR.name)
    assert from_default.died_at == NOW + timedelta(seconds=1)
    # A second sweep finds nothing.
    assert absorb_broker_dead_letters(client, namespace, DeadLetterSink(sessions, alerts=None)) == 0
    client.close()


def test_a_message_for_an_undefined_actor_dead_lettered_by_a_real_worker_ends_up_in_the_store(
    sessions, settings, broker: RedisBroker, redis_url: str
) -> None:
    active = planned(sessions, settings)
    client = redis.Redis.from_url(redis_url)
    namespace = settings.broker_namespace
    broker.declare_queue(BUILD_REPORT.queue)
    started = utcnow() - timedelta(milliseconds=1)
    sent = broker.enqueue(
        message_for(BUILD_REPORT, {"period": str(PERIOD), "user_id": active[1], "template_version": "v1"})
    )
    # No actor is declared on this broker: Dramatiq's worker moves the message to its .XQ.
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        wait_until(
            lambda: client.zcard(f"{namespace}:bulk.XQ") == 1,
            timeout=10,
            interval=0.05,
            what="Dramatiq to dead-letter the message",
        )
    finally:
        worker.stop()
    rejected_by = utcnow()

    moved = absorb_broker_dead_letters(client, namespace, DeadLetterSink(sessions, alerts=None))

    assert moved == 1
    assert xq_keys(client, namespace) == []
    [stored] = letters(sessions)
    assert (stored.message_id, stored.reason, stored.user_id) == (sent.message_id, "broker", active[1])
    assert started <= stored.died_at <= rejected_by
    assert item(sessions, active[1]).state == ItemState.DEAD  # type: ignore[union-attr]
    client.close()


def test_one_xq_entry_that_cannot_be_stored_does_not_keep_the_others_in_the_xq(
    sessions, settings, broker: RedisBroker, redis_url: str
) -> None:
    """A message for an undefined actor whose name is longer than the store's column died first; a normal
    one died after it. The sweep a worker runs at boot must still move the normal one."""
    active = planned(sessions, settings)
    namespace = settings.broker_namespace
    client = redis.Redis.from_url(redis_url)
    odd = Message(queue_name="bulk", actor_name="x" * 200, args=(), kwargs={}, options={"redis_message_id": "r-odd"})
    normal = message_for(BUILD_REPORT, {"period": str(PERIOD), "user_id": active[0], "template_version": "v1"})
    normal = normal.copy(options={"redis_message_id": "r-normal"})
    client.hset(f"{namespace}:bulk.XQ.msgs", mapping={"r-odd": odd.encode(), "r-normal": normal.encode()})
    client.zadd(f"{namespace}:bulk.XQ", {"r-odd": NOW_MS, "r-normal": NOW_MS + 1})

    sweeper = BrokerDeadLetters(DeadLetterSink(sessions, alerts=None), interval_seconds=3600)
    sweeper.after_worker_boot(broker, None)  # type: ignore[arg-type]
    sweeper.before_worker_shutdown(broker, None)  # type: ignore[arg-type]

    stored = {letter.message_id for letter in letters(sessions)}
    assert normal.message_id in stored
    assert client.zscore(f"{namespace}:bulk.XQ", "r-normal") is None
    assert item(sessions, active[0]).state == ItemState.DEAD  # type: ignore[union-attr]
    client.close()
