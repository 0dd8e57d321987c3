"""Sending as a mail server expects, with real workers against an aiosmtpd server that limits its
client, refuses the content, or reads the EHLO name: the fleet follows the server's pace, a
rejection that would hit everyone pauses the month after a few dead letters, and the worker log
has one line per event and no traceback."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest
from sqlalchemy import select

from reports.models import PeriodRun, RunState
from tests.acceptance.test_failures import (
    PERIOD,
    assert_each_mailed_once,
    dead_summary,
    dlq_list,
    progress,
    trigger,
    user_id_of,
    wait_complete,
)
from tests.support.databases import load_users
from tests.support.processes import run_cli
from tests.support.smtp import RateLimit
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

TOO_BIG = "552 5.3.4 Error: message file too big"
NO_SUCH_USER = "550 5.1.1 <{address}>: Recipient address rejected: User unknown"


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r"\bERROR\b|\bCRITICAL\b", line)]


def test_against_a_server_that_limits_the_client_everyone_is_mailed_once_with_few_refusals_and_a_quiet_log(
    settings, sessions, smtp_server, start_workers
):
    # One retry at most: a refusal about the pace that spent one would dead-letter users.
    settings = replace(settings, smtp_url=smtp_server.url, max_retries=1, min_backoff_ms=100, max_backoff_ms=500)
    population = load_users(sessions, count=150, inactive_every=1000)
    bounced = [u for u in population.active if u % 50 == 0]
    smtp_server.handler.rate_limit = RateLimit(messages=20, window_seconds=1.0)
    smtp_server.handler.rcpt_fault = lambda address: (
        NO_SUCH_USER.format(address=address) if user_id_of(address) % 50 == 0 else None
    )
    group = start_workers(settings, processes=2, threads=4)

    trigger(settings)
    final = wait_complete(sessions, timeout=120)

    delivered = [u for u in population.active if u not in bounced]
    assert (final["delivered"], final["dead"]) == (len(delivered), len(bounced)), dead_summary(dlq_list(settings))
    assert_each_mailed_once(smtp_server, delivered)
    refusals = smtp_server.handler.rate_refusals
    assert refusals > 0, "the server never limited the client: the test proves nothing"
    # Unfollowed, 8 threads against 20 a second make several refusals per message.
    assert refusals / len(population.active) < 0.5, refusals
    group.stop()
    log = group.log()
    assert "Traceback" not in log
    # One ERROR per dead letter, and nothing else at ERROR.
    errors = error_lines(log)
    assert len(errors) == len(bounced), errors
    assert all("Dead letter: message" in line for line in errors), errors
    # Each refusal about the pace is one deferral line with the message's id and the next attempt's time.
    deferrals = [line for line in log.splitlines() if "Deferred message" in line and "slower pace" in line]
    assert len(deferrals) == refusals
    assert all(re.search(r"Deferred message [0-9a-f-]{36} \(build_report\) to \d{4}-\d\d-\d\dT", d) for d in deferrals)
    assert "Retrying message" not in log
    assert "example.test" not in log  # the masked reply, and ids only


def test_a_552_to_every_message_pauses_the_month_after_a_few_dead_letters_and_a_trigger_resumes_it(
    settings, sessions, smtp_server, start_workers, webhook
):
    threshold = 3
    settings = replace(
        settings,
        smtp_url=smtp_server.url,
        brake_failure_threshold=threshold,
        brake_window_seconds=60,
        alert_webhook_url=f"http://127.0.0.1:{webhook.server_port}/hooks/alerts",
    )
    population = load_users(sessions, count=60, inactive_every=1000)
    smtp_server.handler.fault = lambda rcpt, attempt: TOO_BIG
    group = start_workers(settings, processes=1, threads=2)

    trigger(settings)
    wait_until(lambda: run_state(sessions) == RunState.CANCELLED, timeout=30, what="the brake to pause the period")
    wait_until(lambda: (p := progress(sessions)) and p["dead"] >= threshold, timeout=10, what="the dead letters")
    # Only the refusals that tripped the brake die: one refused after the trip, by a message that
    # read the period before the pause was committed, waits the trip out and stays pending.
    time.sleep(1)
    paused = progress(sessions)
    assert paused is not None
    assert paused["dead"] == threshold, paused
    # The walk may have been paused too: what it recorded is pending but the few dead.
    assert (paused["delivered"], paused["pending"]) == (0, paused["total"] - paused["dead"]), paused
    assert smtp_server.messages == []
    brake_posts = [body for _, body in webhook.posts if "period" in body]
    assert [(b["period"], b["failures"]) for b in brake_posts] == [(PERIOD, threshold)]
    assert "5.3.4" in brake_posts[0]["reply"]
    paused_lines = [line for line in group.log().splitlines() if f"Period {PERIOD} paused" in line]
    assert len(paused_lines) == 1 and "reports trigger" in paused_lines[0]

    # The operator fixes the cause, resumes the period, and replays the few dead letters.
    smtp_server.handler.fault = None
    trigger(settings)
    wait_until(lambda: (p := progress(sessions)) and p["pending"] == 0 and p, timeout=60, what="the resumed run")
    replayed = run_cli(settings, "dlq", "replay", "--period", PERIOD)
    assert replayed.returncode == 0, replayed.stderr
    final = wait_complete(sessions)
    assert (final["delivered"], final["dead"]) == (len(population.active), 0)
    assert_each_mailed_once(smtp_server, population.active)
    assert "Traceback" not in group.log()


def run_state(sessions) -> str | None:
    with sessions() as session:
        return session.scalar(select(PeriodRun.state).where(PeriodRun.period == PERIOD))


def test_the_workers_give_smtp_helo_name_in_ehlo(settings, sessions, smtp_server, start_workers):
    settings = replace(settings, smtp_url=smtp_server.url, smtp_helo_name="mail.reports.test")
    population = load_users(sessions, count=5, inactive_every=1000)
    start_workers(settings, processes=1, threads=2)
    trigger(settings)
    wait_complete(sessions)
    assert_each_mailed_once(smtp_server, population.active)
    assert smtp_server.handler.helo_names == {"mail.reports.test"}
