"""`reports prune` as an operator runs it: bad input changes nothing, a dry run changes nothing,
a real run deletes the old periods and keeps the open one and what dead letters need."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from reports.clock import utcnow
from reports.feedback import store
from reports.feedback.events import Kind
from reports.models import FeedbackEvent, ReportItem, RunState
from tests.integration.test_feedback_store import POLICY, event
from tests.integration.test_retention import USERS, add_users, dead_letter, everything, fill_period, rows
from tests.support.databases import load_users
from tests.support.periods import month_from_now
from tests.support.processes import run_cli

pytestmark = pytest.mark.acceptance

OLD, OPEN, RECENT = month_from_now(-20), month_from_now(-19), month_from_now(-1)


@pytest.fixture
def filled(sessions):
    with sessions.begin() as session:
        add_users(session)
        fill_period(session, OLD, dead_user=2)
        fill_period(session, OPEN, state=RunState.ACTIVE, pending=3)
        fill_period(session, RECENT)
        dead_letter(session, OLD, 2, replayed=False)
    return sessions


@pytest.mark.parametrize(
    "arguments",
    [
        (),
        ("--older-than-months", "0"),
        ("--older-than-months", "1201"),
        ("--older-than-months", "a year"),
        ("--older-than-months", "12", "--force"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_deletes_nothing(settings, filled, arguments):
    before = everything(filled)
    result = run_cli(settings, "prune", *arguments)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1
    assert everything(filled) == before


def test_a_dry_run_says_what_would_go_and_changes_nothing(settings, filled):
    before = everything(filled)
    result = run_cli(settings, "prune", "--older-than-months", "12", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert everything(filled) == before
    lines = result.stdout.splitlines()
    assert f"{OLD}: would delete 9 reports, 9 deliveries, 9 report items" in lines[0]
    assert "kept 1 user(s) an unreplayed dead letter needs" in lines[0]
    assert lines[1] == f"{OPEN}: kept whole, its run is unfinished."
    assert lines[-1].startswith("Would delete 27 row(s) of 1 period(s)")


def test_a_real_run_deletes_old_periods_and_keeps_the_open_one_and_dead_lettered_items(settings, filled):
    result = run_cli(settings, "prune", "--older-than-months", "12")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("Deleted 27 row(s) of 1 period(s)")
    assert rows(filled, ReportItem, OLD) == [2]
    assert rows(filled, ReportItem, OPEN) == rows(filled, ReportItem, RECENT) == list(range(1, USERS + 1))
    progress = run_cli(settings, "progress", OLD, "--json")
    assert progress.returncode == 0 and '"total": 1' in progress.stdout and '"dead": 1' in progress.stdout
    # Run again: nothing more to do.
    again = run_cli(settings, "prune", "--older-than-months", "12")
    assert again.stdout.splitlines()[-1].startswith("Deleted 0 row(s)")


def test_old_provider_feedback_goes_with_the_months_but_not_what_a_suppression_or_the_soft_bounce_window_needs(
    settings, sessions
):
    load_users(sessions, count=3)
    long_ago = utcnow() - timedelta(days=500)
    with sessions.begin() as session:
        store.record(
            session,
            [
                event(Kind.COMPLAINT, "user1@example.test", event_id="suppressed-user-1", occurred_at=long_ago),
                event(Kind.SOFT_BOUNCE, "user2@example.test", summary="Transient/MailboxFull", occurred_at=long_ago),
                event(Kind.HARD_BOUNCE, "stranger@example.test", occurred_at=long_ago),
            ],
            now=long_ago,
            policy=POLICY,
        )
    dry = run_cli(settings, "prune", "--older-than-months", "12", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete 2; kept 1 a suppression points to." in dry.stdout
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(FeedbackEvent)) == 3

    # A soft-bounce window longer than the months kept keeps what it still counts.
    wide = run_cli(replace(settings, soft_bounce_window_days=600), "prune", "--older-than-months", "12")
    assert wide.returncode == 0 and "Feedback events" not in wide.stdout, wide.stdout
    result = run_cli(settings, "prune", "--older-than-months", "12")
    assert result.returncode == 0, result.stderr
    assert "deleted 2; kept 1 a suppression points to." in result.stdout
    with sessions() as session:
        assert session.scalars(select(FeedbackEvent.event_id)).all() == ["suppressed-user-1"]
