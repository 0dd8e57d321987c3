"""Progress counted from the items' durable state, on real databases."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reports import items, progress
from reports.clock import utcnow
from reports.errors import BadInput
from reports.models import ItemState
from reports.periods import Period
from reports.planning import plan_slice
from tests.conftest import load_users
from tests.integration.conftest import PERIOD, RecordingSender, plan_everything, trigger


def counted(sessions: sessionmaker[Session], period: Period = PERIOD) -> progress.Progress:
    with sessions() as session:
        return progress.count(session, period)


def finish(sessions: sessionmaker[Session], user_id: int, state: ItemState, error: str | None = None) -> bool:
    with sessions.begin() as session:
        return items.finish(session, PERIOD, user_id, state, now=utcnow(), error=error)


def test_progress_counts_items_by_their_final_state(settings, sessions):
    population = load_users(sessions, count=20)
    plan_everything(sessions, settings)
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
        "complete": False,
    }
    assert result.delivered + result.skipped + result.dead + result.pending == result.total


def test_an_item_finishes_once_and_its_first_state_is_what_progress_counts(settings, sessions):
    population = load_users(sessions, count=10)
    plan_everything(sessions, settings)
    user_id = population.active[0]

    assert finish(sessions, user_id, ItemState.DELIVERED) is True
    assert finish(sessions, user_id, ItemState.DEAD, error="late failure") is False

    result = counted(sessions)
    assert (result.delivered, result.dead) == (1, 0)


def test_a_period_is_complete_once_planned_and_every_item_finished(settings, sessions):
    population = load_users(sessions, count=12)
    plan_everything(sessions, settings)
    for user_id in population.active:
        finish(sessions, user_id, ItemState.DELIVERED)

    result = counted(sessions)

    assert result.complete is True
    assert (result.total, result.delivered, result.pending) == (len(population.active),) * 2 + (0,)


def test_a_period_still_being_planned_is_not_complete_even_with_nothing_pending(settings, sessions):
    population = load_users(sessions, count=40)
    trigger(sessions, settings)
    plan_slice(sessions, PERIOD, RecordingSender(), page_size=settings.plan_page_size, budget_seconds=0)
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
    plan_everything(sessions, settings)

    with pytest.raises(BadInput):
        counted(sessions, Period.parse("2026-09"))
