"""Delivery-path correctness with real workers, PostgreSQL and a real SMTP server: slow commits,
lost send-now requests, a long outage with reconcile running, and a walk cancelled mid-way."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest
import redis
from sqlalchemy import select, text

from reports.clock import utcnow
from reports.fanout import runs
from reports.fanout.reconcile import Reconciliation
from reports.models import PeriodRun
from reports.periods import Period
from reports.worker.broker import build_broker
from reports.worker.queues import queue_for
from tests.acceptance.test_failures import (
    PERIOD,
    assert_each_mailed_once,
    dlq_list,
    progress_json,
    trigger,
    wait_complete,
)
from tests.support.databases import load_users
from tests.support.processes import run_cli
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)]

#: Every transaction that changes a report item sleeps this long inside its COMMIT: what a
#: synchronous replica in another zone does to commit latency.
SLOW_COMMIT = """
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('slow.slept', true) IS DISTINCT FROM 'yes' THEN
        PERFORM set_config('slow.slept', 'yes', true);
        PERFORM pg_sleep(0.15);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON report_items
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""


def test_with_commits_slowed_to_150_ms_no_message_reaches_a_worker_before_its_item(
    settings, sessions, smtp_server, start_workers, monkeypatch
):
    settings = replace(settings, smtp_url=smtp_server.url, plan_page_size=10)
    population = load_users(sessions, count=200)
    with sessions.begin() as session:
        session.execute(text(SLOW_COMMIT))
    # Idle workers look at the queue every 50 ms (Dramatiq reads this itself): a message handed
    # out before its page commits is fetched inside the commit's 150 ms.
    monkeypatch.setenv("dramatiq_worker_timeout", "50")
    start_workers(settings, processes=2, threads=4)

    trigger(settings)
    wait_complete(sessions, timeout=120)

    assert dlq_list(settings) == []
    assert_each_mailed_once(smtp_server, population.active)
    final = progress_json(settings)
    assert (final["delivered"], final["dead"], final["pending"], final["complete"]) == (
        len(population.active),
        0,
        0,
        True,
    )


def test_a_send_now_request_whose_message_redis_lost_is_sent_once_by_reconcile(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=6, inactive_every=1000)
    trigger(settings)
    requested = run_cli(settings, "send-now", "2", PERIOD)
    assert requested.returncode == 0, requested.stderr
    request_id = re.search(r"request ([0-9a-f-]{36})", requested.stdout).group(1)  # type: ignore[union-attr]
    # A failover without persistence: the critical queue's message is gone before any worker ran.
    client = redis.Redis.from_url(settings.broker_url)
    client.delete(f"{settings.broker_namespace}:critical", f"{settings.broker_namespace}:critical.msgs")
    start_workers(settings, processes=1, threads=4)
    wait_complete(sessions)
    assert_each_mailed_once(smtp_server, population.active)  # the request has not gone out

    found = run_cli(settings, "reconcile", PERIOD, "--stuck-after", "0", "--json")
    assert found.returncode == 0, found.stderr
    assert '"requests_requeued": 1' in found.stdout, found.stdout
    wait_until(lambda: len(smtp_server.by_user().get(2, [])) == 2, timeout=30, what="the request's email")
    again = run_cli(settings, "reconcile", PERIOD, "--stuck-after", "0", "--json")
    assert '"requests_requeued": 0' in again.stdout, again.stdout

    time.sleep(1)
    ids = sorted(m["Message-ID"].strip() for m in smtp_server.by_user()[2])
    assert ids == sorted([f"<report.{PERIOD}.2@reports.test>", f"<report.{PERIOD}.2.{request_id}@reports.test>"])
    assert {u: len(ms) for u, ms in smtp_server.by_user().items() if u != 2} == {
        u: 1 for u in population.active if u != 2
    }


def test_an_outage_and_a_slow_drain_longer_than_the_stuck_threshold_send_everyone_once_with_one_chain(
    settings, sessions, smtp_server, start_workers
):
    """Time compressed: reconcile every half second with a 2 s threshold, through a 6 s outage and
    a drain of several seconds, behind a 10-message high-water mark the walk keeps pausing on."""
    settings = replace(
        settings,
        smtp_url=smtp_server.url,
        reconcile_stuck_after_seconds=2,
        plan_page_size=7,
        plan_high_water=10,
        plan_pause_seconds=0.5,
        breaker_failure_threshold=2,
        # Longer than the threshold: a message deferred by the open breaker runs (and touches its
        # item) once a cool-down, so its item goes untouched past the threshold while it waits, and
        # reconcile must tell it from lost by the breaker and the backlog. At 1 s, a deferral's
        # round (the cool-down and the delay queue's poll) took about 2 s, and reconcile saw such
        # an item in only 1 to 3 of about 25 looks.
        breaker_cooldown_seconds=3,
    )
    population = load_users(sessions, count=40, inactive_every=1000)
    smtp_server.stop()
    # The walk reads as alive only while its chain stamps the run within the 2 s threshold, so the
    # chain's pool looks at its queues every 0.1 s: a continuation passes two (the delay queue,
    # then the queue), and an idle consumer looks every second by default, which stretched the
    # 0.5 s pause to 1.1-1.9 s between slices, and once to 2.4 s (reconcile then started a second
    # chain). The pools are production's (the Procfile's worker-default and worker-bulk): on the
    # senders' threads, a slice also waited behind the sends it paused for.
    coordinators = start_workers(
        settings, processes=1, threads=1, queues=("default",), env={"dramatiq_worker_timeout": "100"}
    )
    senders = start_workers(settings, processes=1, threads=4, queues=("bulk",))
    trigger(settings)

    found: list[Reconciliation] = []
    done = threading.Event()

    def reconcile_all_along() -> None:
        broker = build_broker(settings)
        while not done.is_set():
            found.append(
                runs.reconcile_through(
                    sessions,
                    queue_for(broker),
                    Period.parse(PERIOD),
                    redis_client=redis.Redis.from_url(settings.shared_redis_url),
                    namespace=settings.broker_namespace,
                    stuck_after=timedelta(seconds=2),
                    now=utcnow(),
                )
            )
            time.sleep(0.5)

    reconciler = threading.Thread(target=reconcile_all_along, daemon=True)
    reconciler.start()
    try:
        time.sleep(6)
        assert smtp_server.messages == []
        smtp_server.handler.delay_seconds = 0.3  # about 13 sends a second on 4 threads: a drain of ~3 s
        smtp_server.start()
        wait_complete(sessions, timeout=120)
    finally:
        done.set()
        reconciler.join(timeout=10)

    assert_each_mailed_once(smtp_server, population.active)
    assert len(found) > 10
    assert [r for r in found if r.requeued or r.coordinator_enqueued] == [], "reconcile took waiting for lost"
    assert any(r.waiting for r in found) and any(r.walk_paused for r in found)
    chains = set(re.findall(r"chain ([0-9a-f-]{36})", coordinators.log() + senders.log()))
    assert len(chains) == 1, chains


def test_a_walk_cancelled_mid_way_is_finished_when_the_period_is_resumed(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, plan_page_size=7, plan_high_water=5, plan_pause_seconds=0.5)
    population = load_users(sessions, count=60, inactive_every=1000)
    smtp_server.handler.delay_seconds = 0.1
    start_workers(settings, processes=1, threads=2)
    trigger(settings)
    wait_until(lambda: len(smtp_server.messages) >= 3, timeout=30, what="the first deliveries")

    assert run_cli(settings, "cancel", PERIOD).returncode == 0
    time.sleep(2)
    with sessions() as session:
        run = session.scalars(select(PeriodRun).where(PeriodRun.period == PERIOD)).one()
        assert run.planned is False, "the walk ended before the cancel; the test needs it mid-way"
    resumed = run_cli(settings, "trigger", PERIOD)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stdout + resumed.stderr

    final = wait_complete(sessions, timeout=120)
    assert (final["planned"], final["delivered"], final["pending"]) == (True, len(population.active), 0)
    assert_each_mailed_once(smtp_server, population.active)
