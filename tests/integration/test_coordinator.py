"""The coordinator against real databases and a real Redis: every active user enqueued, once."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import select, text, update

from reports import partitions
from reports.clock import utcnow
from reports.fanout.coordinator import HANDOFF_GRACE, UnknownRun, walk_slice
from reports.fanout.reconcile import reconcile
from reports.models import ItemState, PeriodRun, ReportItem
from reports.periods import Period
from tests.integration.conftest import (
    PERIOD,
    RecordingQueue,
    count_items,
    item_user_ids,
    queued_user_ids,
    run_together,
    trigger,
)
from tests.support.broker import queued_messages
from tests.support.databases import load_users


class SenderCrash(RuntimeError):
    """The coordinator's process dies while handing a page to the broker."""


class CrashingSender(RecordingQueue):
    """Sends its first batch, then raises before sending anything on the second call."""

    def send_jobs(self, spec, payloads):  # type: ignore[no-untyped-def]
        if self.calls >= 1:
            self.calls += 1
            raise SenderCrash("killed after recording a page, before enqueueing it")
        return super().send_jobs(spec, payloads)


def run_row(sessions) -> PeriodRun:  # type: ignore[no-untyped-def]
    with sessions() as session:
        run = session.get(PeriodRun, str(PERIOD))
        assert run is not None
        return run


def walk(sessions, settings, sender, *, budget_seconds: float = 60):  # type: ignore[no-untyped-def]
    return walk_slice(sessions, PERIOD, sender, page_size=settings.plan_page_size, budget_seconds=budget_seconds)


def test_the_coordinator_records_and_enqueues_one_item_per_active_user_across_pages(
    settings, sessions, broker, redis_url
):
    population = load_users(sessions, count=40, inactive_every=5)
    assert len(population.active) > 3 * settings.plan_page_size
    trigger(sessions, settings)
    sender = RecordingQueue(broker)

    outcome = walk(sessions, settings, sender)

    assert outcome.planned is True
    assert outcome.enqueued == len(population.active)
    assert outcome.cursor == population.active[-1]
    assert sorted(sender.user_ids) == population.active
    assert queued_messages(redis_url, settings.broker_namespace, "bulk") == len(population.active)
    assert queued_user_ids(settings) == Counter(population.active)

    assert item_user_ids(sessions) == Counter(population.active)
    assert not set(item_user_ids(sessions)) & set(population.inactive)
    assert count_items(sessions, ReportItem.state == ItemState.PENDING) == len(population.active)
    assert count_items(sessions, ReportItem.enqueued_at.is_(None)) == 0

    run = run_row(sessions)
    assert run.planned is True
    assert run.planned_at is not None
    assert run.cursor == population.active[-1]


def test_walking_a_planned_period_again_enqueues_nothing(settings, sessions, broker, redis_url):
    population = load_users(sessions, count=20)
    trigger(sessions, settings)
    walk(sessions, settings, RecordingQueue(broker))
    assert queued_messages(redis_url, settings.broker_namespace, "bulk") == len(population.active)

    again = RecordingQueue(broker)
    outcome = walk(sessions, settings, again)

    assert outcome.planned is True
    assert outcome.enqueued == 0
    assert again.user_ids == []
    assert queued_messages(redis_url, settings.broker_namespace, "bulk") == len(population.active)
    assert item_user_ids(sessions) == Counter(population.active)


def test_every_message_is_handed_out_only_after_its_item_is_committed(settings, sessions, broker):
    """A worker that fetches a message at once, from another connection, must find its item."""
    population = load_users(sessions, count=40)
    trigger(sessions, settings)
    seen_by_a_worker: list[int] = []

    class LookingSender(RecordingQueue):
        def send_jobs(self, spec, payloads):  # type: ignore[no-untyped-def]
            batch = list(payloads)
            with sessions() as other_connection:
                seen_by_a_worker.extend(
                    other_connection.scalars(
                        select(ReportItem.user_id).where(
                            ReportItem.period == str(PERIOD), ReportItem.user_id.in_([p["user_id"] for p in batch])
                        )
                    )
                )
            return super().send_jobs(spec, batch)

    sender = LookingSender(broker)
    walk(sessions, settings, sender)

    assert sorted(sender.user_ids) == population.active
    assert sorted(seen_by_a_worker) == population.active


def test_a_coordinator_crash_between_recording_and_enqueueing_a_page_loses_no_user(
    settings, sessions, broker, redis_url
):
    population = load_users(sessions, count=40)
    page = settings.plan_page_size
    trigger(sessions, settings)
    crashing = CrashingSender(broker)

    with pytest.raises(SenderCrash):
        walk(sessions, settings, crashing)

    # The second page is recorded and the cursor past it, but its items say they were never
    # handed out: nothing of it reached the broker.
    assert crashing.user_ids == population.active[:page]
    assert run_row(sessions).cursor == population.active[2 * page - 1]
    assert item_user_ids(sessions) == Counter(population.active[: 2 * page])
    never_handed_out = select(ReportItem.user_id).where(ReportItem.enqueued_at.is_(None)).order_by(ReportItem.user_id)
    with sessions() as session:
        assert list(session.scalars(never_handed_out)) == population.active[page : 2 * page]
    assert queued_user_ids(settings) == Counter(population.active[:page])

    # The walk goes on from the cursor. At its end the page never handed out is still within its
    # grace (the copy that recorded it might be sending it): the walk does not end, it waits.
    resumed = RecordingQueue(broker)
    outcome = walk(sessions, settings, resumed)
    assert (outcome.planned, outcome.settling) == (False, True)
    assert sorted(crashing.user_ids + resumed.user_ids) == population.active[:page] + population.active[2 * page :]
    assert run_row(sessions).planned is False

    # Once the grace has passed, the walk hands the page out and ends: no reconcile needed.
    with sessions.begin() as session:
        session.execute(
            update(ReportItem).where(ReportItem.enqueued_at.is_(None)).values(updated_at=utcnow() - 2 * HANDOFF_GRACE)
        )
    outcome = walk(sessions, settings, resumed)
    assert (outcome.planned, outcome.settling) == (True, False)
    assert count_items(sessions, ReportItem.enqueued_at.is_(None)) == 0
    assert queued_user_ids(settings) == Counter(population.active)
    assert queued_messages(redis_url, settings.broker_namespace, "bulk") == len(population.active)


def test_reconcile_sends_a_page_a_coordinator_crashed_on_after_its_walk_was_over(settings, sessions, broker, redis_url):
    """The last hand-out can crash too; reconcile sends what is left once it is stuck."""
    population = load_users(sessions, count=40)
    trigger(sessions, settings)
    walk(sessions, settings, RecordingQueue(broker))
    with sessions.begin() as session:
        session.execute(
            update(ReportItem).where(ReportItem.user_id.in_(population.active[:3])).values(enqueued_at=None)
        )

    found = reconcile(
        sessions,
        PERIOD,
        RecordingQueue(broker),  # the walk's messages are still in Redis: the backlog is deep
        stuck_after=timedelta(minutes=10),
        now=utcnow() + timedelta(minutes=11),
    )
    assert found.requeued == 3
    assert count_items(sessions, ReportItem.enqueued_at.is_(None)) == 0
    assert queued_user_ids(settings) == Counter(population.active + population.active[:3])


def test_two_coordinators_at_once_enqueue_every_active_user_exactly_once(settings, sessions, broker):
    population = load_users(sessions, count=100)
    trigger(sessions, settings)
    senders = [RecordingQueue(broker, pause_seconds=0.01), RecordingQueue(broker, pause_seconds=0.01)]
    run_together(*(lambda sender=sender: walk(sessions, settings, sender) for sender in senders))

    first, second = (Counter(sender.user_ids) for sender in senders)
    assert set(first) | set(second) == set(population.active)
    assert first + second == Counter(population.active), "some user was enqueued twice"
    assert queued_user_ids(settings) == Counter(population.active)
    assert item_user_ids(sessions) == Counter(population.active)
    assert count_items(sessions) == len(population.active)
    run = run_row(sessions)
    assert run.planned is True
    assert run.cursor == population.active[-1]


def test_a_slice_with_no_time_left_stops_after_one_page_and_the_next_continues(settings, sessions, broker):
    population = load_users(sessions, count=40)
    page = settings.plan_page_size
    trigger(sessions, settings)

    first_sender = RecordingQueue(broker)
    first = walk(sessions, settings, first_sender, budget_seconds=0)

    assert first.planned is False
    assert first.pages == 1
    assert first.cursor == population.active[page - 1]
    assert first_sender.user_ids == population.active[:page]
    assert run_row(sessions).planned is False
    assert item_user_ids(sessions) == Counter(population.active[:page])

    second_sender = RecordingQueue(broker)
    second = walk(sessions, settings, second_sender, budget_seconds=0)

    assert second.planned is False
    assert second.cursor == population.active[2 * page - 1]
    assert second_sender.user_ids == population.active[page : 2 * page]
    assert run_row(sessions).cursor == population.active[2 * page - 1]

    rest_sender = RecordingQueue(broker)
    rest = walk(sessions, settings, rest_sender)

    assert rest.planned is True
    assert rest_sender.user_ids == population.active[2 * page :]
    assert queued_user_ids(settings) == Counter(population.active)


def test_walking_a_period_that_was_never_triggered_is_refused(settings, sessions, broker, redis_url):
    load_users(sessions, count=10)
    trigger(sessions, settings, Period.parse("2026-09"))
    sender = RecordingQueue(broker)

    with pytest.raises(UnknownRun):
        walk(sessions, settings, sender)

    assert sender.user_ids == []
    assert queued_messages(redis_url, settings.broker_namespace, "bulk") == 0
    assert count_items(sessions) == 0
    with sessions() as session:
        assert session.scalars(select(PeriodRun.period)).all() == ["2026-09"]


def test_items_an_earlier_release_recorded_but_never_sent_are_sent_once(settings, sessions, broker, redis_url):
    """That release recorded a page and sent it in two transactions; a crash between them left
    items with no ``enqueued_at``, in the next page's range and (the user since deactivated)
    below the checkpoint."""
    population = load_users(sessions, count=30, inactive_every=4)
    trigger(sessions, settings)
    deactivated = population.inactive[0]
    above = [user_id for user_id in population.active if user_id > deactivated]
    in_next_page = above[0]
    with sessions.begin() as session:
        earlier = utcnow() - 2 * HANDOFF_GRACE
        for user_id in (in_next_page, deactivated):
            session.add(
                ReportItem(
                    period=str(PERIOD),
                    user_id=user_id,
                    state=ItemState.PENDING,
                    attempts=0,
                    created_at=earlier,
                    updated_at=earlier,
                )
            )
        session.get(PeriodRun, str(PERIOD)).cursor = deactivated  # type: ignore[union-attr]

    sender = RecordingQueue(broker)
    outcome = walk(sessions, settings, sender)

    assert outcome.planned is True
    assert Counter(sender.user_ids) == Counter([deactivated, *above])
    assert queued_user_ids(settings) == Counter([deactivated, *above])
    assert count_items(sessions, ReportItem.enqueued_at.is_(None)) == 0


def test_users_with_a_zero_or_negative_id_are_walked_once_each_page_by_page(settings, sessions, broker):
    """The walk once began at ``id > 0``: users -5 and 0 never got an item, and nothing said so."""
    population = load_users(sessions, count=0, ids=[-(2**31), -5, 0, 1])
    trigger(sessions, settings)
    assert run_row(sessions).cursor is None
    sender = RecordingQueue(broker)

    outcome = walk_slice(sessions, PERIOD, sender, page_size=1, budget_seconds=60)

    assert outcome.planned and outcome.cursor == 1
    assert sorted(sender.user_ids) == population.active == [-(2**31), -5, 0, 1]
    assert item_user_ids(sessions) == Counter(population.active)


def test_reconcile_re_enqueues_lost_items_of_zero_and_negative_ids(settings, sessions, broker):
    population = load_users(sessions, count=0, ids=[-5, 0, 1])
    trigger(sessions, settings)
    walk(sessions, settings, RecordingQueue(broker))
    with sessions.begin() as session:  # the last hand-out crashed: none of them went out
        session.execute(update(ReportItem).values(enqueued_at=None))
    again = RecordingQueue(broker)

    found = reconcile(sessions, PERIOD, again, stuck_after=timedelta(minutes=10), now=utcnow() + timedelta(minutes=11))

    assert found.requeued == 3 and sorted(again.user_ids) == population.active


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_month_triggered_by_a_release_that_made_no_partitions_is_walked_all_the_same(settings, sessions, broker):
    population = load_users(sessions, count=10)
    trigger(sessions, settings)
    with sessions.begin() as session:
        for table in partitions.PARTITIONED:
            session.execute(text(f"DROP TABLE {partitions.name(table, PERIOD)}"))
    sender = RecordingQueue(broker)

    assert walk(sessions, settings, sender).planned

    assert sorted(sender.user_ids) == sorted(population.active)
    with sessions() as session:
        assert partitions.present(session, PERIOD) == list(partitions.PARTITIONED)
