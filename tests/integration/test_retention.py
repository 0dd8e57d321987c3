"""Pruning old periods on SQLite and PostgreSQL: what goes, what stays, in batches, resumably,
and the scheduler's monthly run."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import redis
from sqlalchemy import event, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from reports import partitions, pruning
from reports.cli.prune import describe
from reports.clock import utcnow
from reports.delivery import claims, pipeline
from reports.delivery.mail.backend import build_mailer
from reports.failures import dead_letters
from reports.fanout import progress, runs
from reports.feedback import store as feedback_store
from reports.feedback.events import Kind
from reports.jobs import SEND_NOW, SendNowJob
from reports.models import (
    DeadLetter,
    Delivery,
    DeliveryState,
    FeedbackEvent,
    ItemCount,
    ItemState,
    PeriodRun,
    Report,
    ReportItem,
    RunState,
    SendNowRequest,
    User,
)
from reports.ops import retention
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import Broker, build_broker
from reports.worker.queues import queue_for
from scheduler.process import SchedulerProcess, prune_lock_key
from scheduler.schedule import Schedule
from tests.integration.test_feedback_store import POLICY
from tests.integration.test_feedback_store import event as feedback_event
from tests.support.databases import pg_connect
from tests.support.processes import run_cli
from tests.support.waiting import wait_until

NOW = datetime(2021, 3, 10, 12, 0)
OLD, CANCELLED, UNPLANNED, RECENT = "2020-01", "2020-02", "2020-03", "2021-02"
BEFORE = Period.parse("2021-01")
USERS = 10
#: In OLD: user 3's message died (not replayed), user 4's died and was replayed, user 5 asked for a send-now.
DEAD_USER, REPLAYED_USER, SEND_NOW_USER = 3, 4, 5


def fill_period(
    session: Session,
    period: str,
    *,
    state: RunState = RunState.ACTIVE,
    planned: bool = True,
    pending: int = 0,
    dead_user: int | None = None,
) -> None:
    """A run of ``USERS`` items with reports; delivered ones have a sent delivery, ``dead_user``'s is dead."""
    partitions.ensure(session, period)  # as the period's trigger does
    session.add(
        PeriodRun(
            period=period,
            state=state,
            template_version="v1",
            cursor=USERS,
            planned=planned,
            triggered_at=NOW,
            updated_at=NOW,
        )
    )
    for user_id in range(1, USERS + 1):
        item_state = ItemState.PENDING if user_id <= pending else ItemState.DELIVERED
        if user_id == dead_user:
            item_state = ItemState.DEAD
        session.add(
            ReportItem(period=period, user_id=user_id, state=item_state, attempts=1, created_at=NOW, updated_at=NOW)
        )
        session.add(
            Report(
                period=period,
                user_id=user_id,
                template_version="v1",
                subject="s",
                body_text="t",
                body_html="<p>h</p>" * 50,
                rendered_at=NOW,
            )
        )
        if item_state == ItemState.DELIVERED:
            session.add(sent_delivery(period, user_id))


def sent_delivery(period: str, user_id: int) -> Delivery:
    return Delivery(
        period=period,
        user_id=user_id,
        state=DeliveryState.SENT,
        message_id="<m>",
        claim_token="t",
        lease_expires_at=NOW,
        claimed_at=NOW,
        sent_at=NOW,
    )


def dead_letter(session: Session, period: str, user_id: int, *, replayed: bool, job: SendNowJob | None = None) -> None:
    """A monthly report's dead letter, or with ``job`` a send-now's."""
    session.add(
        DeadLetter(
            message_id=f"m-{period}-{user_id}",
            actor=SEND_NOW.name if job else "build_report",
            queue="critical" if job else "bulk",
            payload=json.dumps(
                {"args": list(SEND_NOW.arguments(job.payload())) if job else [period, user_id, "v1"], "kwargs": {}}
            ),
            period=period,
            user_id=user_id,
            attempts=1,
            reason="permanent",
            error_class="MailRejected",
            error_message="550",
            first_failed_at=NOW,
            died_at=NOW,
            replayed_at=NOW if replayed else None,
        )
    )


def send_now_request(session: Session, period: str, user_id: int, state: DeliveryState) -> None:
    session.add(
        SendNowRequest(
            request_id=f"00000000-0000-0000-0000-{user_id:012d}",
            period=period,
            user_id=user_id,
            state=state,
            message_id="<r>",
            claim_token="t",
            lease_expires_at=NOW,
            claimed_at=NOW,
            requested_at=NOW,
            sent_at=NOW if state == DeliveryState.SENT else None,
        )
    )


def add_users(session: Session) -> None:
    session.add_all([User(id=i, email=f"u{i}@example.test", name=None, active=True) for i in range(1, USERS + 1)])


@pytest.fixture
def filled(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    with sessions.begin() as session:
        add_users(session)
        fill_period(session, OLD, dead_user=DEAD_USER)
        fill_period(session, CANCELLED, state=RunState.CANCELLED, pending=2)
        fill_period(session, UNPLANNED, planned=False)
        fill_period(session, RECENT)
        dead_letter(session, OLD, DEAD_USER, replayed=False)
        dead_letter(session, OLD, REPLAYED_USER, replayed=True)
        send_now_request(session, OLD, SEND_NOW_USER, DeliveryState.SENT)
    return sessions


def rows(sessions: sessionmaker[Session], model: type, period: str) -> list[int]:
    with sessions() as session:
        column = model.user_id  # type: ignore[attr-defined]
        return sorted(session.scalars(select(column).where(model.period == period)))  # type: ignore[attr-defined]


def everything(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as session:
        return {
            model.__tablename__: session.scalar(select(func.count()).select_from(model)) or 0
            for model in (PeriodRun, ReportItem, Report, Delivery, DeadLetter, SendNowRequest, ItemCount)
        }


@pytest.mark.parametrize(
    ("now", "months", "oldest_kept"),
    [
        (datetime(2026, 12, 1), 12, "2025-12"),
        (datetime(2026, 12, 31, 23, 59), 12, "2025-12"),
        (datetime(2026, 1, 15), 1, "2025-12"),
        (datetime(2026, 1, 15), 13, "2024-12"),
        (datetime(2026, 3, 1), 1200, "1926-03"),
    ],
)
def test_the_cutoff_keeps_that_many_months_before_the_current_one(now, months, oldest_kept) -> None:
    assert str(retention.cutoff(now, months)) == oldest_kept


def test_an_old_period_loses_its_rows_but_not_what_an_unreplayed_dead_letter_needs(filled) -> None:
    result = retention.prune(filled, before=BEFORE, batch_size=3)

    assert [p.period for p in result.periods] == [OLD]
    assert result.periods[0].deleted == {
        "reports": USERS - 1,
        "deliveries": USERS - 1,
        "report items": USERS - 1,
        "send-now requests": 1,
        "replayed dead letters": 1,
    }
    assert result.finished
    # The dead-lettered user keeps the item its replay resets, and the report.
    assert rows(filled, ReportItem, OLD) == [DEAD_USER]
    assert rows(filled, Report, OLD) == [DEAD_USER]
    assert rows(filled, Delivery, OLD) == []
    with filled() as session:
        assert session.scalars(select(DeadLetter.user_id)).all() == [DEAD_USER]
        assert session.get(PeriodRun, OLD) is not None
        # Progress counts what is left: the one dead item, nothing pending.
        left = progress.count(session, Period.parse(OLD))
        assert (left.total, left.dead, left.pending, left.complete) == (1, 1, 0, True)
        assert (
            session.scalar(select(func.count()).select_from(ItemCount).where(ItemCount.period == OLD, ItemCount.n == 0))
            == 0
        )


def test_the_rows_of_users_with_a_zero_or_negative_id_are_pruned_too(filled) -> None:
    with filled.begin() as session:
        for user_id in (-5, 0):
            session.add(User(id=user_id, email=f"u{user_id}@example.test", name=None, active=True))
            session.add(
                ReportItem(
                    period=OLD, user_id=user_id, state=ItemState.DELIVERED, attempts=1, created_at=NOW, updated_at=NOW
                )
            )
            session.add(sent_delivery(OLD, user_id))

    retention.prune(filled, before=BEFORE, batch_size=3)

    assert rows(filled, ReportItem, OLD) == [DEAD_USER]
    assert rows(filled, Delivery, OLD) == []


def test_unfinished_and_recent_periods_are_kept_whole(filled) -> None:
    result = retention.prune(filled, before=BEFORE)
    assert result.unfinished == [CANCELLED, UNPLANNED]
    for period in (CANCELLED, UNPLANNED, RECENT):
        assert rows(filled, ReportItem, period) == list(range(1, USERS + 1))
        assert rows(filled, Report, period) == list(range(1, USERS + 1))


def test_a_prune_stopped_between_batches_finishes_when_run_again(filled) -> None:
    stopped = retention.prune(filled, before=BEFORE, batch_size=3, should_stop=lambda: True, batched=True)
    assert not stopped.finished
    # The first batch, users 1 to 3, of which the dead-lettered user 3 stays.
    assert stopped.rows == 2
    assert rows(filled, Report, OLD) == list(range(3, USERS + 1))

    again = retention.prune(filled, before=BEFORE, batch_size=3)
    assert again.finished
    assert rows(filled, ReportItem, OLD) == rows(filled, Report, OLD) == [DEAD_USER]
    # Nothing is left to delete, and a third run says so.
    assert retention.prune(filled, before=BEFORE).rows == 0


def replaying_once(
    sessions: sessionmaker[Session], broker: Broker, replayed: dead_letters.Replayed
) -> Callable[[], bool]:
    """A prune's ``should_stop`` that replays OLD's dead letters the first time it is asked."""

    def replay() -> bool:
        if not replayed.replayed:
            replayed.replayed = dead_letters.replay(
                sessions, queue_for(broker), dead_letters.Filter(period=OLD), now=NOW, dry_run=False
            ).replayed
        return False

    return replay


def test_a_dead_letter_replayed_between_two_batches_stops_the_prune_of_its_period(filled, broker: Broker) -> None:
    # Feedback received since OLD began is kept while OLD is (CANCELLED, kept whole, began later).
    bounced_at = Period.parse(OLD).start + timedelta(days=19)
    with filled.begin() as session:
        feedback_store.record(
            session,
            [feedback_event(Kind.SOFT_BOUNCE, "stranger@example.test", event_id="old-bounce", occurred_at=bounced_at)],
            now=bounced_at,
            policy=POLICY,
        )
    replayed = dead_letters.Replayed()
    replay_after_the_first_batch = replaying_once(filled, broker, replayed)
    result = retention.prune(
        filled, before=BEFORE, batch_size=3, should_stop=replay_after_the_first_batch, batched=True
    )

    assert len(replayed.replayed) == 1
    # Only the first batch went (users 1 to 3, the dead-lettered user 3 kept): the replayed
    # message finds its item, now pending, with its report; and the replayed letter stays.
    assert rows(filled, ReportItem, OLD) == list(range(1, USERS + 1))
    assert rows(filled, Report, OLD) == list(range(DEAD_USER, USERS + 1))
    with filled() as session:
        assert session.get(ReportItem, (OLD, DEAD_USER)).state == ItemState.PENDING  # type: ignore[union-attr]
        assert sorted(session.scalars(select(DeadLetter.user_id).where(DeadLetter.period == OLD))) == [
            DEAD_USER,
            REPLAYED_USER,
        ]
    [pruned] = result.periods
    assert pruned.deleted == {"reports": 2}
    assert pruned.reopened and result.finished
    assert feedback_events(filled) == ["old-bounce"]
    # Once the item is delivered, the period is finished again, and the next prune finishes it.
    with filled.begin() as session:
        session.get(ReportItem, (OLD, DEAD_USER)).state = ItemState.DELIVERED  # type: ignore[union-attr]
    again = retention.prune(filled, before=BEFORE, batch_size=3)
    assert not again.periods[0].reopened
    assert rows(filled, ReportItem, OLD) == rows(filled, Report, OLD) == rows(filled, Delivery, OLD) == []
    assert feedback_events(filled) == []


def feedback_events(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        return sorted(session.scalars(select(FeedbackEvent.event_id)))


def waiting_on_a_lock(sessions: sessionmaker[Session]) -> int:
    """How many connections to the test's PostgreSQL database wait for a lock."""
    with sessions() as session:
        return session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_a_replay_or_a_send_now_and_a_prune_batch_of_one_period_wait_for_each_other(
    filled, broker: Broker, settings: Settings
) -> None:
    # A replay waits while a batch of its period is under way, so the batch keeps what it needs.
    with ThreadPoolExecutor(max_workers=1) as pool:
        with filled.begin() as batch:
            runs.finished(batch, OLD, lock=True)  # what a batch does first: lock the run, then check
            replaying = pool.submit(
                dead_letters.replay, filled, queue_for(broker), dead_letters.Filter(period=OLD), now=NOW, dry_run=False
            )
            wait_until(lambda: waiting_on_a_lock(filled), timeout=10, what="the replay to wait for the batch")
        assert len(replaying.result(timeout=10).replayed) == 1

    # A batch waits while a replay of its period is under way, then sees the item pending and stops.
    with filled.begin() as session:
        session.get(ReportItem, (OLD, DEAD_USER)).state = ItemState.DEAD  # type: ignore[union-attr]
    with ThreadPoolExecutor(max_workers=1) as pool:
        with filled.begin() as replay:
            pruning.hold_off(replay, [OLD])
            prune = pool.submit(retention.prune, filled, before=BEFORE, batch_size=3)
            wait_until(lambda: waiting_on_a_lock(filled), timeout=10, what="the batch to wait for the replay")
            replay.get(ReportItem, (OLD, DEAD_USER)).state = ItemState.PENDING  # type: ignore[union-attr]
        [pruned] = prune.result(timeout=10).periods
    assert rows(filled, ReportItem, OLD) == rows(filled, Report, OLD) == list(range(1, USERS + 1))
    assert pruned.reopened and not any(pruned.deleted.values())

    # So does a send-now request, which the next batch then sees.
    with ThreadPoolExecutor(max_workers=1) as pool:
        with filled.begin() as batch:
            runs.finished(batch, OLD, lock=True)  # what a batch does first: lock the run, then check
            requesting = pool.submit(run_cli, settings, "send-now", "9", OLD)
            wait_until(lambda: waiting_on_a_lock(filled), timeout=30, what="the send-now to wait for the batch")
            assert rows(filled, SendNowRequest, OLD) == [SEND_NOW_USER]
        assert requesting.result(timeout=30).returncode == 0
    assert rows(filled, SendNowRequest, OLD) == [SEND_NOW_USER, 9]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_a_prune_reading_its_months_and_a_trigger_making_partitions_do_not_deadlock(
    filled, settings: Settings
) -> None:
    # The prune's first reads are held between two tables while a new month's trigger makes its
    # partitions, which locks the same tables: in opposite orders, one of the two was killed.
    engine = filled.kw["bind"]
    held, go = threading.Event(), threading.Event()

    def hold_the_prune(_conn, _cursor, statement: str, *_args: object) -> None:
        if threading.current_thread().name.startswith("prune") and "FROM deliveries" in statement and not held.is_set():
            held.set()
            go.wait(10)

    event.listen(engine, "before_cursor_execute", hold_the_prune)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prune") as prunes, ThreadPoolExecutor(1) as triggers:
            pruning = prunes.submit(retention.prune, filled, before=BEFORE)
            assert held.wait(10)

            def trigger_a_new_month() -> None:
                with filled.begin() as session:
                    runs.trigger(session, Period.parse("2021-03"), template_version="v1", now=NOW)

            triggering = triggers.submit(trigger_a_new_month)
            wait_until(lambda: waiting_on_a_lock(filled) or triggering.done(), timeout=10, what="the trigger")
            go.set()
            triggering.result(timeout=20)
            result = pruning.result(timeout=20)
    finally:
        go.set()
        event.remove(engine, "before_cursor_execute", hold_the_prune)
    assert [p.period for p in result.periods] == [OLD]
    assert rows(filled, ReportItem, OLD) == [DEAD_USER]
    with filled() as session:
        assert partitions.present(session, "2021-03") == list(partitions.PARTITIONED)


@pytest.mark.claim_lease_seconds(10)
def test_a_copy_of_a_sent_send_now_message_that_comes_after_a_prune_sends_nothing(
    filled, settings: Settings, smtp_server
) -> None:
    # A copy still on its way when the month is pruned (deferred while the first copy sent, or
    # redelivered after a crash) must find the request that says its email went out.
    mail = replace(settings, smtp_url=smtp_server.url)
    context = pipeline.Context(settings=mail, sessions=filled, mailer=build_mailer(mail))
    request_id, period = str(uuid.uuid4()), Period.parse(OLD)
    with filled.begin() as session:
        claims.record_send_now_request(
            session, request_id, period, 2, message_id="<r>", template_version="v1", now=utcnow()
        )
    job = SendNowJob(period, 2, request_id, "v1")
    assert pipeline.send_now(context, job) == pipeline.Outcome.DELIVERED

    retention.prune(filled, before=BEFORE)
    assert pipeline.send_now(context, job) == pipeline.Outcome.ALREADY_DONE
    assert len(smtp_server.messages) == 1

    # A week on, no copy is left to come: the request goes with the month's next prune.
    retention.prune(filled, before=BEFORE, now=utcnow() + retention.SEND_NOW_KEPT + timedelta(hours=1))
    with filled() as session:
        assert session.get(SendNowRequest, request_id) is None


def test_a_send_now_requested_between_two_batches_stops_the_prune_of_its_period(filled) -> None:
    def request_after_the_first_batch() -> bool:
        with filled.begin() as session:
            if not session.scalar(select(func.count()).select_from(SendNowRequest).where(SendNowRequest.user_id == 9)):
                send_now_request(session, OLD, 9, DeliveryState.REQUESTED)
        return False

    result = retention.prune(
        filled, before=BEFORE, batch_size=3, should_stop=request_after_the_first_batch, batched=True
    )

    assert rows(filled, Report, OLD) == list(range(DEAD_USER, USERS + 1))
    assert rows(filled, Delivery, OLD) == [u for u in range(1, USERS + 1) if u != DEAD_USER]
    assert result.periods[0].reopened


def test_a_period_never_triggered_that_has_send_now_requests_is_kept_whole(filled) -> None:
    # A send-now of a period never triggered took the monthly claim: that delivery is what keeps a
    # later trigger from mailing the user again.
    untriggered = "2019-06"
    with filled.begin() as session:
        send_now_request(session, untriggered, 2, DeliveryState.SENT)
        partitions.ensure(session, untriggered)  # as the send-now request does
        session.add(sent_delivery(untriggered, 2))

    result = retention.prune(filled, before=BEFORE)

    assert untriggered in result.unfinished
    assert untriggered not in [p.period for p in result.periods]
    assert rows(filled, Delivery, untriggered) == rows(filled, SendNowRequest, untriggered) == [2]


def test_a_dry_run_counts_what_would_go_and_changes_nothing(filled) -> None:
    before = everything(filled)
    dry = retention.prune(filled, before=BEFORE, dry_run=True)
    assert everything(filled) == before
    real = retention.prune(filled, before=BEFORE)
    assert [p.deleted for p in dry.periods] == [p.deleted for p in real.periods]
    assert dry.periods[0].kept_for_dead_letters == 1


def test_the_scheduler_prunes_once_a_day_across_replicas_from_the_2nd(filled, settings: Settings) -> None:
    configured = Settings(**{**{f: getattr(settings, f) for f in settings.__dataclass_fields__}, "retention_months": 2})
    broker = build_broker(configured)
    client = redis.Redis.from_url(configured.broker_url)
    replicas = [
        SchedulerProcess(
            configured,
            Schedule.from_settings(configured),
            sessions=filled,
            broker=broker,
            redis_client=client,
            clock=lambda: NOW,
        )
        for _ in range(2)
    ]

    with filled.begin() as session:
        long_ago = NOW - timedelta(days=420)  # before CANCELLED, which is kept whole, and its feedback with it
        feedback_store.record(
            session,
            [feedback_event(Kind.HARD_BOUNCE, "stranger@example.test", occurred_at=long_ago)],
            now=long_ago,
            policy=POLICY,
        )

    first, second = (replica.prune() for replica in replicas)

    assert first is not None and [p.period for p in first.periods] == [OLD]
    assert first.feedback is not None and first.feedback.deleted == 1
    assert second is None
    # Held under a day: the next day's run is not turned away by it.
    assert 0 < client.pttl(prune_lock_key(configured.broker_namespace)) < 24 * 3600 * 1000
    assert rows(filled, ReportItem, OLD) == [DEAD_USER]
    [prune] = [job for job in replicas[0].build_scheduler().get_jobs() if job.id == "prune"]
    # A 2nd missed (no scheduler running at 03:00) is made up the next day, not a month later.
    missed = datetime(2026, 11, 2, 3, 1, tzinfo=UTC)
    assert prune.trigger.get_next_fire_time(None, missed) == datetime(2026, 11, 3, 3, 0, tzinfo=UTC)
    assert prune.trigger.get_next_fire_time(None, datetime(2026, 11, 28, 3, 1, tzinfo=UTC)) == datetime(
        2026, 12, 2, 3, 0, tzinfo=UTC
    )
    unset = SchedulerProcess(
        settings, Schedule.from_settings(settings), sessions=filled, broker=broker, redis_client=client
    )
    assert "prune" not in {job.id for job in unset.build_scheduler().get_jobs()}
    broker.close()


def partitions_of(sessions: sessionmaker[Session], period: str) -> list[str]:
    with sessions() as session:
        return partitions.present(session, period)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_an_old_month_goes_by_dropping_its_partitions_and_the_others_keep_theirs(filled) -> None:
    gone = "2020-05"
    with filled.begin() as session:
        fill_period(session, gone)
    statements: list[str] = []
    event.listen(filled.kw["bind"], "before_cursor_execute", lambda *args: statements.append(args[2]))

    result = retention.prune(filled, before=BEFORE)

    assert [(p.period, p.deleted["report items"]) for p in result.periods] == [(OLD, USERS - 1), (gone, USERS)]
    assert partitions_of(filled, gone) == []
    # One statement a table and month, and no row deleted one by one.
    assert [s for s in statements if s.startswith("DROP TABLE")] == [
        f"DROP TABLE {table}_{period.replace('-', '_')}" for period in (OLD, gone) for table in partitions.PARTITIONED
    ]
    assert not [s for s in statements if re.match(r"DELETE FROM (report_items|deliveries|reports)\b", s)]
    # The month with an unreplayed dead letter has new partitions, with that user's rows in them.
    assert partitions_of(filled, OLD) == list(partitions.PARTITIONED)
    assert rows(filled, ReportItem, OLD) == rows(filled, Report, OLD) == [DEAD_USER]
    for period in (CANCELLED, UNPLANNED, RECENT):
        assert partitions_of(filled, period) == list(partitions.PARTITIONED)
        assert rows(filled, ReportItem, period) == rows(filled, Report, period) == list(range(1, USERS + 1))
    with filled() as session:
        left = progress.count(session, Period.parse(OLD))
        assert (left.total, left.dead, left.pending, left.complete) == (1, 1, 0, True)
        assert progress.count(session, Period.parse(gone)).total == 0
        assert session.scalar(select(func.count()).select_from(ItemCount).where(ItemCount.period == gone)) == 0
    # Pruned again, the month with only kept rows has nothing to drop.
    statements.clear()
    assert retention.prune(filled, before=BEFORE).rows == 0
    assert not [s for s in statements if s.startswith("DROP TABLE")]
    assert rows(filled, ReportItem, OLD) == [DEAD_USER]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_a_prune_stopped_before_a_drop_keeps_the_month_whole_until_run_again(filled) -> None:
    stopped = retention.prune(filled, before=BEFORE, should_stop=lambda: True)
    assert not stopped.finished and stopped.rows == 0
    assert rows(filled, ReportItem, OLD) == rows(filled, Report, OLD) == list(range(1, USERS + 1))

    again = retention.prune(filled, before=BEFORE)
    assert again.finished and again.rows == 3 * (USERS - 1) + 2
    assert rows(filled, ReportItem, OLD) == [DEAD_USER]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_a_dead_letter_replayed_just_before_the_drop_keeps_the_month_whole(filled, broker) -> None:
    replayed = dead_letters.Replayed()
    [pruned] = retention.prune(filled, before=BEFORE, should_stop=replaying_once(filled, broker, replayed)).periods

    assert len(replayed.replayed) == 1

    assert pruned.reopened and not any(pruned.deleted.values())
    assert rows(filled, ReportItem, OLD) == rows(filled, Report, OLD) == list(range(1, USERS + 1))
    assert partitions_of(filled, OLD) == list(partitions.PARTITIONED)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_a_drop_gives_way_to_a_long_transaction_and_tries_again(filled, monkeypatch) -> None:
    """A transaction on another month's rows holds the drop off: the drop waits a moment, gives
    way (so the workers queued behind it run on), and tries again; held too long, the prune stops
    there, changing nothing, and says it did not finish."""
    worker = filled()
    worker.execute(select(ReportItem).where(ReportItem.period == RECENT).with_for_update())
    monkeypatch.setattr(retention, "LOCK_ATTEMPTS", 2)
    gave_up = retention.prune(filled, before=BEFORE)
    assert not gave_up.finished and gave_up.rows == 0
    assert describe(gave_up, dry_run=False)[0] == (
        f"{OLD}: kept whole, other transactions kept its tables busy; run the prune again."
    )
    assert rows(filled, ReportItem, OLD) == list(range(1, USERS + 1))

    monkeypatch.setattr(retention, "LOCK_ATTEMPTS", 20)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pruning = pool.submit(retention.prune, filled, before=BEFORE)
        wait_until(lambda: waiting_on_a_lock(filled), timeout=10, what="the drop to wait for the transaction")
        worker.commit()
        worker.close()
        assert pruning.result(timeout=30).finished
    assert rows(filled, ReportItem, OLD) == [DEAD_USER]


class _WatchingQueue:
    """The broker's queue, looking first at whether a worker could read the per-user tables."""

    def __init__(self, inner: object, database_url: str) -> None:
        self.inner, self.database_url = inner, database_url
        self.tables_locked: list[bool] = []

    def enqueue_again(self, **message: object) -> str:
        with pg_connect(self.database_url) as probe:
            probe.execute("SET lock_timeout = 200")
            try:
                probe.execute("SELECT 1 FROM report_items LIMIT 1")
                self.tables_locked.append(False)
            except psycopg.errors.LockNotAvailable:
                self.tables_locked.append(True)
        return self.inner.enqueue_again(**message)  # type: ignore[attr-defined, no-any-return]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_a_send_now_replayed_after_its_month_was_dropped_finds_the_month_to_write_in(
    filled, broker
) -> None:
    gone, user_id = "2020-05", USERS + 1
    with filled.begin() as session:
        fill_period(session, gone)
        # A user with no item that month (they joined after it), whose send-now died before it
        # wrote anything: its request dead, its letter not replayed.
        session.add(User(id=user_id, email="late@example.test", name=None, active=True))
        send_now_request(session, gone, user_id, DeliveryState.DEAD)
        job = SendNowJob(Period.parse(gone), user_id, f"00000000-0000-0000-0000-{user_id:012d}", "v1")
        dead_letter(session, gone, user_id, replayed=False, job=job)
    retention.prune(filled, before=BEFORE)
    assert partitions_of(filled, gone) == []

    queue = _WatchingQueue(queue_for(broker), filled.kw["bind"].url.render_as_string(hide_password=False))
    dead_letters.replay(filled, queue, dead_letters.Filter(), now=NOW, dry_run=False)

    assert partitions_of(filled, gone) == list(partitions.PARTITIONED)
    # Made before the letters were enqueued, in a transaction of their own: while the chunk's
    # letters went to the broker one by one, the tables every worker reads were not locked.
    assert queue.tables_locked == [False, False]
    with filled() as session:
        assert session.scalar(select(SendNowRequest.state).where(SendNowRequest.period == gone)) == "requested"
