"""``reports reconcile`` as an operator runs it: what it prints, what it re-sends, and what it rejects."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.fanout import runs
from reports.fanout.coordinator import walk_slice
from reports.jobs import CoordinatorJob, ReportJob
from reports.models import ReportItem
from reports.periods import Period
from reports.queue import InMemoryQueue
from reports.settings import Settings
from tests.support.broker import jobs_in_queue, messages_in_queue, queue_counts
from tests.support.databases import load_users
from tests.support.processes import run_cli

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"
NEVER_TRIGGERED = "2026-09"
KEYS = {
    "period",
    "planned",
    "active_users",
    "items",
    "active_without_item",
    "finished",
    "pending",
    "requeued",
    "waiting",
    "coordinator_enqueued",
    "walk_paused",
    "requests_requeued",
    "scheduled",
    "cancelled",
}


# --- helpers ---------------------------------------------------------------------------------


def trigger(sessions: sessionmaker[Session], settings: Settings) -> None:
    with sessions.begin() as session:
        runs.trigger(session, Period.parse(PERIOD), template_version=settings.template_version, now=utcnow())


def walk(sessions: sessionmaker[Session], *, budget_seconds: float = 60, page_size: int = 50) -> bool:
    """Walk the period with a broker that loses every message; returns whether the walk finished."""
    return walk_slice(
        sessions,
        Period.parse(PERIOD),
        InMemoryQueue(),
        page_size=page_size,
        budget_seconds=budget_seconds,
    ).planned


def age_items(sessions: sessionmaker[Session], *, minutes: float = 60) -> None:
    with sessions.begin() as session:
        session.execute(update(ReportItem).values(updated_at=utcnow() - timedelta(minutes=minutes)))


def items_snapshot(sessions: sessionmaker[Session]) -> list[tuple]:
    with sessions() as session:
        return [
            tuple(row)
            for row in session.execute(
                select(
                    ReportItem.period,
                    ReportItem.user_id,
                    ReportItem.state,
                    ReportItem.enqueued_at,
                    ReportItem.updated_at,
                ).order_by(ReportItem.period, ReportItem.user_id)
            )
        ]


def assert_rejected(result: subprocess.CompletedProcess[str]) -> str:
    described = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, described
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), described
    assert result.stdout == "", described
    return lines[0]


# --- JSON ------------------------------------------------------------------------------------


def test_reconcile_json_prints_one_object_with_every_count(settings, sessions):
    population = load_users(sessions, count=20)
    trigger(sessions, settings)
    assert walk(sessions)
    age_items(sessions)

    result = run_cli(settings, "reconcile", PERIOD, "--json")

    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 1
    found = json.loads(result.stdout)
    assert set(found) == KEYS
    active = len(population.active)
    assert found == {
        "period": PERIOD,
        "planned": True,
        "active_users": active,
        "items": active,
        "active_without_item": 0,
        "finished": 0,
        "pending": active,
        "requeued": active,
        "waiting": 0,
        "coordinator_enqueued": False,
        "walk_paused": False,
        "requests_requeued": 0,
        "scheduled": 0,
        "cancelled": False,
    }
    assert queue_counts(settings) == {"default": 0, "bulk": active}
    sent = sorted(job.user_id for job in jobs_in_queue(settings, "bulk", ReportJob))
    assert sent == population.active


def test_reconcile_json_twice_re_enqueues_nothing_the_second_time(settings, sessions):
    population = load_users(sessions, count=10)
    trigger(sessions, settings)
    assert walk(sessions)
    age_items(sessions)
    first = run_cli(settings, "reconcile", PERIOD, "--json")
    assert json.loads(first.stdout)["requeued"] == len(population.active)

    again = run_cli(settings, "reconcile", PERIOD, "--json")

    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["requeued"] == 0
    assert queue_counts(settings) == {"default": 0, "bulk": len(population.active)}


def test_recently_touched_items_wait_for_the_default_threshold(settings, sessions):
    load_users(sessions, count=10)
    trigger(sessions, settings)
    assert walk(sessions)

    result = run_cli(settings, "reconcile", PERIOD, "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requeued"] == 0
    assert queue_counts(settings) == {"default": 0, "bulk": 0}


# --- human form ------------------------------------------------------------------------------


def test_reconcile_prints_a_sentence_with_the_re_enqueued_count(settings, sessions):
    population = load_users(sessions, count=10)
    trigger(sessions, settings)
    assert walk(sessions)

    result = run_cli(settings, "reconcile", PERIOD, "--stuck-after", "0")

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    line = result.stdout.strip()
    assert len(line.splitlines()) == 1
    assert PERIOD in line
    assert f"re-enqueued {len(population.active)} lost item" in line
    assert "walk complete" in line
    assert queue_counts(settings)["bulk"] == len(population.active)

    again = run_cli(settings, "reconcile", PERIOD, "--stuck-after", "3600")
    assert again.returncode == 0, again.stderr
    assert "re-enqueued 0 lost item" in again.stdout


# --- an unfinished walk ----------------------------------------------------------------------


def test_reconcile_of_a_triggered_but_unplanned_period_re_enqueues_the_coordinator(settings, sessions):
    population = load_users(sessions, count=10)
    trigger(sessions, settings)

    fresh = run_cli(settings, "reconcile", PERIOD, "--json")
    assert json.loads(fresh.stdout)["coordinator_enqueued"] is False, "a walk just triggered is not stuck yet"
    result = run_cli(settings, "reconcile", PERIOD, "--stuck-after", "0", "--json")

    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["planned"] is False and found["coordinator_enqueued"] is True
    assert found["active_without_item"] == len(population.active)
    assert queue_counts(settings) == {"default": 1, "bulk": 0}
    [message] = messages_in_queue(settings, "default")
    assert message["actor_name"] == "plan_period"
    assert jobs_in_queue(settings, "default", CoordinatorJob) == [CoordinatorJob(Period.parse(PERIOD))]


def test_the_human_form_says_the_coordinator_was_re_enqueued(settings, sessions):
    load_users(sessions, count=30)
    trigger(sessions, settings)
    assert not walk(sessions, budget_seconds=0, page_size=5)
    age_items(sessions)

    result = run_cli(settings, "reconcile", PERIOD, "--stuck-after", "0")

    assert result.returncode == 0, result.stderr
    assert "coordinator re-enqueued" in result.stdout
    assert "re-enqueued 5 lost item" in result.stdout
    assert queue_counts(settings) == {"default": 1, "bulk": 5}


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        pytest.param(("2026-1",), "2026-1", id="malformed-period"),
        pytest.param((NEVER_TRIGGERED,), NEVER_TRIGGERED, id="never-triggered"),
        pytest.param((NEVER_TRIGGERED, "--json"), NEVER_TRIGGERED, id="never-triggered-json"),
        pytest.param((PERIOD, "--stuck-after", "-1"), "stuck-after", id="negative-threshold"),
        pytest.param((PERIOD, "--stuck-after", "abc"), "stuck-after", id="threshold-not-a-number"),
        pytest.param((), "period", id="no-period"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_enqueues_nothing(settings, sessions, args, mentions):
    # A period with stuck items and an unfinished walk: a run that went ahead would enqueue both.
    load_users(sessions, count=20)
    trigger(sessions, settings)
    assert not walk(sessions, budget_seconds=0, page_size=5)
    age_items(sessions)
    before = items_snapshot(sessions)

    line = assert_rejected(run_cli(settings, "reconcile", *args))

    assert mentions.lower() in line.lower(), line
    assert queue_counts(settings) == {"default": 0, "bulk": 0}
    assert items_snapshot(sessions) == before


@pytest.mark.parametrize("threshold", ["nan", "inf", "1e11"])
def test_a_threshold_that_is_not_a_finite_span_before_now_is_bad_input(settings, sessions, threshold):
    # NaN and infinity pass a `>= 0` check; 1e11 s (about 3,000 years) reaches back before year 1.
    load_users(sessions, count=20)
    trigger(sessions, settings)
    assert not walk(sessions, budget_seconds=0, page_size=5)
    age_items(sessions)
    before = items_snapshot(sessions)

    line = assert_rejected(run_cli(settings, "reconcile", PERIOD, "--stuck-after", threshold))

    assert "stuck-after" in line.lower(), line
    assert queue_counts(settings) == {"default": 0, "bulk": 0}
    assert items_snapshot(sessions) == before
