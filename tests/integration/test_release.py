"""Reports released in each user's morning: the walk records every item with its due time, and the
coordinator chain hands each out once when it comes due, on real databases.

The clock is the test's: each release is run at a moment the test names. October 2026 ends on
1 November at 00:00 UTC; at 09:00 local that day Tashkent is at 04:00 UTC, Istanbul at 06:00,
Los Angeles (back on standard time since 02:00 local) at 17:00, and Kiritimati, whose 1st began
while October still ran in UTC, is due on the 2nd local: 19:00 UTC on the 1st.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, time, timedelta

import pytest
from sqlalchemy import select, text

from reports import items
from reports.counters import FALLBACKS
from reports.fanout import progress, runs
from reports.fanout.coordinator import RELEASE_LOOK_SECONDS, SliceOutcome, walk_slice
from reports.fanout.reconcile import reconcile
from reports.jobs import BUILD_REPORT, COORDINATOR, ReportJob
from reports.local_time import SendSchedule
from reports.models import ItemState, ReportItem
from reports.periods import Period
from reports.queue import InMemoryQueue
from reports.worker.broker import build_broker, shared_redis
from scheduler.process import SchedulerProcess
from scheduler.schedule import Schedule
from tests.integration.conftest import PERIOD, run_together
from tests.support.databases import load_users

NINE = SendSchedule(time(9, 0), "UTC")
TRIGGERED = datetime(2026, 11, 1, 0, 5)
DUE = {
    "Asia/Tashkent": datetime(2026, 11, 1, 4, 0),
    "Europe/Istanbul": datetime(2026, 11, 1, 6, 0),
    # No zone, and a name no zone has, are DEFAULT_TIME_ZONE's: UTC here.
    None: datetime(2026, 11, 1, 9, 0),
    "Mars/Olympus": datetime(2026, 11, 1, 9, 0),
    "America/Los_Angeles": datetime(2026, 11, 1, 17, 0),
    "Pacific/Kiritimati": datetime(2026, 11, 1, 19, 0),
}
ZONES = list(DUE)
PAGE = 3


def load_users_in_zones(sessions, count: int = 30) -> dict[int, str | None]:  # type: ignore[no-untyped-def]
    """Active users spread over :data:`ZONES`, in the operator's plain SQL; each user's zone."""
    population = load_users(sessions, count=count, inactive_every=1000)
    zones = {user_id: ZONES[user_id % len(ZONES)] for user_id in population.active}
    with sessions.begin() as session:
        for user_id, zone in zones.items():
            session.execute(text("UPDATE users SET time_zone = :zone WHERE id = :id"), {"zone": zone, "id": user_id})
    return zones


def trigger_at_nine(sessions, period: Period = PERIOD) -> None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        runs.trigger(session, period, template_version="v1", now=TRIGGERED, schedule=NINE)


def step(sessions, queue, at: datetime) -> SliceOutcome:  # type: ignore[no-untyped-def]
    """One slice of the coordinator chain, its clock at ``at``."""
    return walk_slice(sessions, PERIOD, queue, page_size=PAGE, budget_seconds=60, clock=lambda: at)


def handed_out(*queues: InMemoryQueue) -> Counter[int]:
    """How many report messages each user was handed out in."""
    return Counter(ReportJob.parse(m.args, {}).user_id for q in queues for m in q.of(BUILD_REPORT))


def due_by(zones: dict[int, str | None], moment: datetime) -> set[int]:
    return {user_id for user_id, zone in zones.items() if DUE[zone] <= moment}


def counts(sessions, at: datetime) -> progress.Progress:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        return progress.count(session, PERIOD, at)


def test_the_walk_records_every_user_and_hands_out_nobody_before_their_morning(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    queue = InMemoryQueue()
    FALLBACKS.drain()

    outcome = step(sessions, queue, TRIGGERED)

    assert outcome.planned and handed_out(queue) == Counter()
    # Tashkent's morning is hours away: the chain looks again in a minute, not hours on.
    assert outcome.release_in == RELEASE_LOOK_SECONDS
    assert outcome.continue_in(pause_seconds=5) == RELEASE_LOOK_SECONDS
    now = counts(sessions, TRIGGERED)
    assert (now.total, now.pending, now.scheduled, now.complete) == (len(zones), len(zones), len(zones), False)
    assert now.as_dict()["scheduled"] == len(zones)
    # An unknown zone is counted once per user as the walk records them; no zone is no fallback.
    assert FALLBACKS.drain() == {"time_zone": sum(zone == "Mars/Olympus" for zone in zones.values())}


def test_each_user_is_released_once_at_their_nine_oclock_in_pages(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    queue = InMemoryQueue()
    step(sessions, queue, TRIGGERED)

    for due in sorted(set(DUE.values())):
        before = step(sessions, queue, due - timedelta(seconds=30))
        assert set(handed_out(queue)) == due_by(zones, due - timedelta(seconds=1)), f"released early at {due}"
        # Half a minute before the due time the chain says to look again then.
        assert before.release_in == 30
        step(sessions, queue, due)
        assert set(handed_out(queue)) == due_by(zones, due), f"not released at {due}"
        waiting = counts(sessions, due).scheduled
        assert waiting == len(zones) - len(due_by(zones, due))

    assert handed_out(queue) == Counter(dict.fromkeys(zones, 1))
    last = step(sessions, queue, max(DUE.values()) + timedelta(hours=1))
    # Nothing waits any more: the chain ends.
    assert last.release_in is None and last.continue_in(pause_seconds=5) is None


def test_the_walk_hands_out_at_once_whoever_is_due_already(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    queue = InMemoryQueue()
    # A month triggered late, at noon UTC on the 1st: only Los Angeles and Kiritimati still wait.
    noon = datetime(2026, 11, 1, 12, 0)

    step(sessions, queue, noon)

    assert set(handed_out(queue)) == due_by(zones, noon)
    assert counts(sessions, noon).scheduled == len(zones) - len(due_by(zones, noon))


def test_a_page_that_mixes_due_and_waiting_users_stamps_only_those_it_sent(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    noon = datetime(2026, 11, 1, 12, 0)

    # One page of everyone: users still waiting for their morning sit between those sent.
    walk_slice(sessions, PERIOD, InMemoryQueue(), page_size=100, budget_seconds=60, clock=lambda: noon)

    # Only those sent are stamped as having a message out there: reconcile tells the others apart.
    with sessions.begin() as session:
        stamped = set(session.scalars(select(ReportItem.user_id).where(ReportItem.enqueued_at.is_not(None))))
    assert stamped == due_by(zones, noon)


def test_two_releases_at_once_and_reconcile_hand_each_item_out_once(sessions):
    zones = load_users_in_zones(sessions, count=60)
    trigger_at_nine(sessions)
    walked = InMemoryQueue()
    step(sessions, walked, TRIGGERED)
    nine = DUE[None]
    queues = [InMemoryQueue() for _ in range(3)]

    run_together(
        lambda: step(sessions, queues[0], nine),
        lambda: step(sessions, queues[1], nine),
        # Reconcile sees the items come due and never released, as after a dead chain.
        lambda: reconcile(sessions, PERIOD, queues[2], stuck_after=timedelta(seconds=1), now=nine),
    )

    assert handed_out(walked, *queues) == Counter(dict.fromkeys(due_by(zones, nine), 1))


def test_a_user_whose_zone_changes_before_their_morning_is_released_at_the_new_one(sessions):
    load_users(sessions, count=4, inactive_every=1000)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET time_zone = 'Asia/Tashkent' WHERE id IN (1, 2)"))
        session.execute(text("UPDATE users SET time_zone = 'America/Los_Angeles' WHERE id IN (3, 4)"))
    trigger_at_nine(sessions)
    queue = InMemoryQueue()
    step(sessions, queue, TRIGGERED)
    # After the walk recorded their due times: user 1 moves west, user 3 east, by plain SQL.
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET time_zone = 'America/Los_Angeles' WHERE id = 1"))
        session.execute(text("UPDATE users SET time_zone = 'Europe/Istanbul' WHERE id = 3"))

    step(sessions, queue, DUE["Asia/Tashkent"])
    assert set(handed_out(queue)) == {2}
    # User 3 waits for Istanbul's morning now, user 1 for Los Angeles's, with user 4.
    assert counts(sessions, DUE["Asia/Tashkent"]).scheduled == 3
    step(sessions, queue, DUE["Europe/Istanbul"])
    assert set(handed_out(queue)) == {2, 3}
    step(sessions, queue, DUE["America/Los_Angeles"] - timedelta(minutes=1))
    assert set(handed_out(queue)) == {2, 3}
    step(sessions, queue, DUE["America/Los_Angeles"])
    assert handed_out(queue) == Counter({1: 1, 2: 1, 3: 1, 4: 1})


class DiesAfterStamping(InMemoryQueue):
    """A worker killed after its release committed a page, before the page reached the broker."""

    def send_jobs(self, spec, payloads):  # type: ignore[no-untyped-def]
        raise SystemExit("killed")


def test_a_release_that_dies_after_stamping_its_page_loses_nothing(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    step(sessions, InMemoryQueue(), TRIGGERED)
    tashkent = DUE["Asia/Tashkent"]
    with pytest.raises(SystemExit):
        step(sessions, DiesAfterStamping(), tashkent)
    # The page is stamped as handed out and no message carries it: pending, no longer scheduled.
    with sessions.begin() as session:
        stamped = session.scalars(
            select(ReportItem.user_id).where(ReportItem.enqueued_at.is_not(None), ReportItem.due_at.is_(None))
        ).all()
    assert len(stamped) == PAGE

    # The chain carries on with the rest, and workers deliver them; once the queue is empty and the
    # page stuck, reconcile finds the page no message carries.
    queue = InMemoryQueue()
    step(sessions, queue, tashkent + timedelta(seconds=5))
    assert set(handed_out(queue)) == due_by(zones, tashkent) - set(stamped)
    found = reconcile(sessions, PERIOD, queue, stuck_after=timedelta(minutes=10), now=tashkent + timedelta(minutes=11))
    assert found.requeued == 0, "re-sent a page that may still be on its way"
    with sessions.begin() as session:
        for user_id in handed_out(queue):
            items.finish(session, PERIOD, user_id, ItemState.DELIVERED, now=tashkent)
    repair = InMemoryQueue()
    found = reconcile(sessions, PERIOD, repair, stuck_after=timedelta(minutes=10), now=tashkent + timedelta(minutes=11))
    assert found.requeued == PAGE and set(handed_out(repair)) == set(stamped)
    assert found.scheduled == len(zones) - len(due_by(zones, tashkent))


def test_reconcile_tells_not_yet_due_from_lost_and_restarts_a_dead_chain(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    step(sessions, InMemoryQueue(), TRIGGERED)

    early = InMemoryQueue()
    found = reconcile(sessions, PERIOD, early, stuck_after=timedelta(0), now=TRIGGERED + timedelta(minutes=1))
    assert (found.requeued, found.waiting, found.scheduled) == (0, 0, len(zones))
    assert found.pending == len(zones) and handed_out(early) == Counter()

    # The chain died: nothing released Tashkent. Past the stuck threshold, reconcile releases what
    # is due and starts a new chain for the rest.
    late = InMemoryQueue()
    at = DUE["Asia/Tashkent"] + timedelta(minutes=11)
    found = reconcile(sessions, PERIOD, late, stuck_after=timedelta(minutes=10), now=at)
    assert set(handed_out(late)) == due_by(zones, at)
    assert found.coordinator_enqueued and [m.actor for m in late.messages].count(COORDINATOR.name) == 1


def test_resuming_a_cancelled_period_sends_nobody_before_their_morning(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    step(sessions, InMemoryQueue(), TRIGGERED)
    with sessions.begin() as session:
        runs.cancel(session, PERIOD, now=TRIGGERED)

    queue = InMemoryQueue()
    at = DUE["Europe/Istanbul"]
    resumed = runs.trigger_and_enqueue(sessions, queue, PERIOD, template_version="v1", now=at, schedule=NINE)

    assert resumed.resumed
    assert set(handed_out(queue)) == due_by(zones, at)
    # The chain is back to release the rest as their mornings come.
    assert [m.actor for m in queue.messages].count(COORDINATOR.name) == 1


def walked_in_tashkent_then_user_1_moves_west(sessions) -> None:  # type: ignore[no-untyped-def]
    """Four users in Tashkent, walked; then user 1 moves to Los Angeles, by plain SQL, before any morning."""
    load_users(sessions, count=4, inactive_every=1000)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET time_zone = 'Asia/Tashkent'"))
    trigger_at_nine(sessions)
    step(sessions, InMemoryQueue(), TRIGGERED)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET time_zone = 'America/Los_Angeles' WHERE id = 1"))


def released_by_the_chain_after(sessions, repair: InMemoryQueue, at: datetime) -> Counter[int]:  # type: ignore[no-untyped-def]
    """The chain run from ``at`` until Los Angeles's morning: who it and ``repair`` handed out, and how often."""
    chain = InMemoryQueue()
    step(sessions, chain, at)
    assert handed_out(chain) == Counter(), "released before their new morning"
    step(sessions, chain, DUE["America/Los_Angeles"])
    return handed_out(repair, chain)


def test_reconcile_leaves_a_user_who_changed_zone_to_the_chain_and_their_new_morning(sessions):
    walked_in_tashkent_then_user_1_moves_west(sessions)

    # The chain died: past the stuck threshold reconcile releases Tashkent's morning.
    repair = InMemoryQueue()
    at = DUE["Asia/Tashkent"] + timedelta(minutes=11)
    found = reconcile(sessions, PERIOD, repair, stuck_after=timedelta(minutes=10), now=at)

    assert set(handed_out(repair)) == {2, 3, 4}
    assert found.coordinator_enqueued
    assert released_by_the_chain_after(sessions, repair, at) == Counter({1: 1, 2: 1, 3: 1, 4: 1})


def test_resuming_a_cancelled_period_sends_a_user_who_changed_zone_meanwhile_at_their_new_morning(sessions):
    walked_in_tashkent_then_user_1_moves_west(sessions)
    with sessions.begin() as session:
        runs.cancel(session, PERIOD, now=TRIGGERED)

    queue = InMemoryQueue()
    at = DUE["Asia/Tashkent"]
    resumed = runs.trigger_and_enqueue(sessions, queue, PERIOD, template_version="v1", now=at, schedule=NINE)

    assert resumed.resumed and set(handed_out(queue)) == {2, 3, 4}
    assert released_by_the_chain_after(sessions, queue, at) == Counter({1: 1, 2: 1, 3: 1, 4: 1})


def test_triggering_a_walked_month_again_restarts_its_release_and_sends_nobody_early(sessions):
    zones = load_users_in_zones(sessions)
    trigger_at_nine(sessions)
    step(sessions, InMemoryQueue(), TRIGGERED)

    queue = InMemoryQueue()
    again = runs.trigger_and_enqueue(sessions, queue, PERIOD, template_version="v1", now=TRIGGERED, schedule=NINE)

    assert again.releasing and not again.created
    assert "release the reports not yet due" in again.describe()
    assert handed_out(queue) == Counter()
    (chain,) = queue.of(COORDINATOR)
    # The new chain releases; the one before it stops at its next look.
    assert walk_slice(sessions, PERIOD, InMemoryQueue(), walker="old", page_size=PAGE, budget_seconds=60).superseded
    released = InMemoryQueue()
    walk_slice(
        sessions, PERIOD, released, walker=chain.walker, page_size=PAGE, budget_seconds=60, clock=lambda: DUE[None]
    )
    assert set(handed_out(released)) == due_by(zones, DUE[None])


def test_the_scheduler_triggers_the_month_as_it_ends_so_the_earliest_mornings_are_on_time(sessions, settings):
    # SCHEDULE_TIME keeps its default, 06:00 UTC: hours after Tashkent's nine o'clock (04:00 UTC).
    configured = dataclasses.replace(settings, send_at_local_time="09:00")
    zones = load_users_in_zones(sessions)
    broker = build_broker(configured)
    ends = datetime(2026, 11, 1, 0, 0, 1)
    scheduler = SchedulerProcess(
        configured,
        Schedule.from_settings(configured),
        sessions=sessions,
        broker=broker,
        redis_client=shared_redis(broker, configured),
        clock=lambda: ends,
    )
    try:
        assert scheduler.catch_up("month-end") == [PERIOD]
        [monthly] = [job for job in scheduler.build_scheduler().get_jobs() if job.id == "monthly-trigger"]
        assert monthly.trigger.get_next_fire_time(None, datetime(2026, 11, 2, tzinfo=UTC)) == datetime(
            2026, 12, 1, tzinfo=UTC
        )
    finally:
        broker.close()
    queue = InMemoryQueue()
    step(sessions, queue, ends)
    tashkent = DUE["Asia/Tashkent"]
    step(sessions, queue, tashkent)
    assert set(handed_out(queue)) == due_by(zones, tashkent) != set()

    # Without SEND_AT_LOCAL_TIME the month waits for SCHEDULE_TIME, as before.
    assert Schedule.from_settings(settings).due_periods(ends) == []
