"""Progress counted from the items' durable state, on real databases."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reports import items
from reports.clock import utcnow
from reports.database import create_db_engine, session_factory, upgrade
from reports.errors import BadInput
from reports.fanout import progress
from reports.fanout.coordinator import walk_slice
from reports.models import ItemState, ReportItem
from reports.periods import Period
from tests.integration.conftest import (
    PERIOD,
    RecordingQueue,
    make_partitions,
    run_together,
    trigger,
    walk_everything,
)
from tests.support.databases import load_users


def counted(sessions: sessionmaker[Session], period: Period = PERIOD) -> progress.Progress:
    with sessions() as session:
        return progress.count(session, period)


def finish(sessions: sessionmaker[Session], user_id: int, state: ItemState, error: str | None = None) -> bool:
    with sessions.begin() as session:
        return items.finish(session, PERIOD, user_id, state, now=utcnow(), error=error)


def test_progress_counts_items_by_their_final_state(settings, sessions):
    population = load_users(sessions, count=20)
    walk_everything(sessions, settings)
    delivered, skipped, dead = population.active[:3], population.active[3:5], population.active[5:6]
    for user_id in delivered:
        assert finish(sessions, user_id, ItemState.DELIVERED)
    for user_id in skipped:
        assert finish(sessions, user_id, ItemState.SKIPPED)
    for user_id in dead:
        assert finish(sessions, user_id, ItemState.DEAD, error="MailRejected: SMTP 550")

    result = counted(sessions)

    assert result.as_dict() == {
        "period": str(PERIOD),
        "total": len(population.active),
        "planned": True,
        "delivered": 3,
        "skipped": 2,
        "dead": 1,
        "pending": len(population.active) - 6,
        "state": "active",
        "complete": False,
    }
    assert result.delivered + result.skipped + result.dead + result.pending == result.total


def test_an_item_finishes_once_and_its_first_state_is_what_progress_counts(settings, sessions):
    population = load_users(sessions, count=10)
    walk_everything(sessions, settings)
    user_id = population.active[0]

    assert finish(sessions, user_id, ItemState.DELIVERED) is True
    assert finish(sessions, user_id, ItemState.DEAD, error="late failure") is False

    result = counted(sessions)
    assert (result.delivered, result.dead) == (1, 0)


def test_a_period_is_complete_once_planned_and_every_item_finished(settings, sessions):
    population = load_users(sessions, count=12)
    walk_everything(sessions, settings)
    for user_id in population.active:
        finish(sessions, user_id, ItemState.DELIVERED)

    result = counted(sessions)

    assert result.complete is True
    assert (result.total, result.delivered, result.pending) == (len(population.active),) * 2 + (0,)


def test_a_period_still_being_planned_is_not_complete_even_with_nothing_pending(settings, sessions):
    population = load_users(sessions, count=40)
    trigger(sessions, settings)
    walk_slice(sessions, PERIOD, RecordingQueue(), page_size=settings.plan_page_size, budget_seconds=0)
    first_page = population.active[: settings.plan_page_size]
    for user_id in first_page:
        finish(sessions, user_id, ItemState.DELIVERED)

    result = counted(sessions)

    assert result.planned is False
    assert result.total == len(first_page)
    assert result.pending == 0
    assert result.complete is False


def test_progress_of_a_period_that_was_never_triggered_is_bad_input(settings, sessions):
    load_users(sessions, count=5)
    walk_everything(sessions, settings)

    with pytest.raises(BadInput):
        counted(sessions, Period.parse("2026-09"))


# --- the kept counts -------------------------------------------------------------------------


def counted_item_by_item(sessions: sessionmaker[Session], period: Period = PERIOD) -> dict[str, int]:
    """What progress used to do: count the items themselves."""
    with sessions() as session:
        rows = session.execute(
            select(ReportItem.state, func.count()).where(ReportItem.period == str(period)).group_by(ReportItem.state)
        ).all()
    by_state = {state: 0 for state in ItemState} | dict(rows)  # type: ignore[arg-type]
    return {"total": sum(by_state.values()), **{str(state): n for state, n in by_state.items()}}


def kept(sessions: sessionmaker[Session], period: Period = PERIOD) -> dict[str, int]:
    result = counted(sessions, period).as_dict()
    return {key: result[key] for key in ("total", "pending", "delivered", "skipped", "dead")}


def test_the_kept_counts_follow_every_change_an_item_can_go_through(settings, sessions):
    population = load_users(sessions, count=60, inactive_every=100)
    walk_everything(sessions, settings)
    users = population.active
    assert kept(sessions) == counted_item_by_item(sessions)

    for user_id, state in zip(users[:12], [ItemState.DELIVERED, ItemState.SKIPPED, ItemState.DEAD] * 4, strict=True):
        finish(sessions, user_id, state)
    assert kept(sessions) == counted_item_by_item(sessions)

    make_partitions(sessions, "2026-09")
    with sessions.begin() as session:
        # A dead-letter replay puts dead items back to pending; an operator deletes a few items;
        # rows arrive by plain SQL, already finished, in one statement.
        session.execute(update(ReportItem).where(ReportItem.state == ItemState.DEAD).values(state=ItemState.PENDING))
        session.execute(delete(ReportItem).where(ReportItem.user_id.in_([users[0], users[1], users[20]])))
        session.execute(
            text(
                "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) VALUES "
                "(:p, 1001, 'delivered', 1, :now, :now), (:p, 1002, 'dead', 1, :now, :now), "
                "(:p, 1003, 'pending', 0, :now, :now), (:q, 1001, 'skipped', 1, :now, :now)"
            ),
            {"p": str(PERIOD), "q": "2026-09", "now": utcnow()},
        )
        # Touching an item without changing its state changes no count.
        session.execute(update(ReportItem).where(ReportItem.user_id == users[30]).values(attempts=5))

    expected = counted_item_by_item(sessions)
    assert kept(sessions) == expected
    assert expected["dead"] == 1 and expected["total"] == len(users) - 3 + 3


def test_items_finished_by_many_workers_at_once_are_each_counted_once(settings, sessions):
    population = load_users(sessions, count=400, inactive_every=1000)
    walk_everything(sessions, settings)
    states = [ItemState.DELIVERED, ItemState.DELIVERED, ItemState.SKIPPED, ItemState.DEAD]
    lanes = [population.active[lane::16] for lane in range(16)]

    def finish_lane(user_ids: list[int]) -> None:
        for user_id in user_ids:
            finish(sessions, user_id, states[user_id % len(states)])

    run_together(*(lambda lane=lane: finish_lane(lane) for lane in lanes))

    assert kept(sessions) == counted_item_by_item(sessions)
    assert counted(sessions).complete is True


def test_items_recorded_before_the_counts_existed_are_counted(settings):
    """Migration 0004 counts what a database at 0003 already holds."""
    upgrade(settings, "0003")
    engine = create_db_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        load_users(sessions, count=30, inactive_every=100)
        with sessions.begin() as session:
            session.execute(
                text(
                    "INSERT INTO period_runs (period, template_version, triggered_at, updated_at, cursor, planned, state) "
                    "VALUES (:p, 'v1', :now, :now, 0, true, 'active')"
                ),
                {"p": str(PERIOD), "now": utcnow()},
            )
            session.execute(
                text(
                    "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at) "
                    "SELECT :p, id, CASE id % 4 WHEN 0 THEN 'delivered' WHEN 1 THEN 'dead' ELSE 'pending' END, 1, :now, :now "
                    "FROM users"
                ),
                {"p": str(PERIOD), "now": utcnow()},
            )
        before = counted_item_by_item(sessions)

        upgrade(settings)

        assert kept(sessions) == before
        finish(sessions, 2, ItemState.SKIPPED)  # and the triggers carry on from there
        assert kept(sessions) == counted_item_by_item(sessions)
    finally:
        engine.dispose()
