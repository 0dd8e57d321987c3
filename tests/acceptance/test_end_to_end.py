"""The whole monthly run with real workers, a real broker, a real database and a real SMTP server."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from tests.support.databases import load_users
from tests.support.processes import run_cli, wait_for_progress

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"


def progress_json(settings) -> dict:
    result = run_cli(settings, "progress", PERIOD, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.both_brokers
def test_every_active_user_gets_exactly_one_correct_email(settings, sessions, smtp_server, start_workers):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=60, inactive_every=5)
    start_workers(settings, processes=2, threads=4)

    triggered = run_cli(settings, "trigger", PERIOD)
    assert triggered.returncode == 0, triggered.stderr
    assert "Triggered 2026-10" in triggered.stdout

    final = wait_for_progress(settings, PERIOD, timeout=90)
    assert final == {
        "period": PERIOD,
        "total": len(population.active),
        "planned": True,
        "delivered": len(population.active),
        "skipped": 0,
        "dead": 0,
        "pending": 0,
        "state": "active",
        "complete": True,
    }

    by_user = smtp_server.by_user()
    assert sorted(by_user) == population.active
    for user_id, messages in by_user.items():
        assert len(messages) == 1, f"user {user_id} got {len(messages)} emails"
        message = messages[0]
        count, total = population.expected[user_id]
        assert message["To"].addresses[0].addr_spec == f"user{user_id}@example.test"
        assert message["Message-ID"] == f"<report.{PERIOD}.{user_id}@reports.test>"
        assert message["X-Report-Period"] == PERIOD
        text = message.get_body(("plain",)).get_content().replace("\r\n", "\n")
        html = message.get_body(("html",)).get_content()
        assert f"Activities: {count}\n" in text
        assert f"Total: {total // 100:,}.{total % 100:02d}\n" in text
        assert "Previous month: 5.55\n" in text
        assert f'<td id="count">{count}</td>' in html

    again = run_cli(settings, "trigger", PERIOD)
    assert again.returncode == 0, again.stderr
    assert again.stdout == (
        f"{PERIOD} is already complete ({len(population.active)} delivered, 0 skipped, 0 dead); "
        "nothing enqueued, nothing sent.\n"
    )
    time.sleep(2)
    assert len(smtp_server.messages) == len(population.active)
    assert progress_json(settings) == final


@pytest.mark.both_brokers
def test_a_user_deactivated_after_planning_is_skipped_not_mailed(settings, sessions, smtp_server, start_workers):
    from sqlalchemy import text

    settings = replace(settings, smtp_url=smtp_server.url)
    load_users(sessions, count=10, inactive_every=100)
    assert run_cli(settings, "trigger", PERIOD).returncode == 0
    # The walk happens in a worker; deactivate user 3 after its item exists but before any worker runs.
    group = start_workers(settings, processes=1, threads=1, queues=("default",))
    wait_for_progress(settings, PERIOD, until="planned", timeout=30)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET active = false WHERE id = 3"))
    group.stop()
    start_workers(settings, processes=1, threads=4)

    final = wait_for_progress(settings, PERIOD)
    assert (final["delivered"], final["skipped"], final["total"]) == (9, 1, 10)
    assert sorted(smtp_server.by_user()) == [1, 2, 4, 5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_workers_log_at_log_level(settings, sessions, smtp_server, start_workers):
    settings = replace(settings, smtp_url=smtp_server.url, log_level="DEBUG")
    load_users(sessions, count=4, inactive_every=100)
    group = start_workers(settings, processes=1, threads=2)
    assert run_cli(settings, "trigger", PERIOD).returncode == 0

    assert wait_for_progress(settings, PERIOD)["delivered"] == 4
    group.stop()
    # Dramatiq's command line sets its worker processes at INFO (DEBUG only with -v).
    assert "[DEBUG]" in group.log()
