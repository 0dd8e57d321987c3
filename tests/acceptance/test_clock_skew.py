"""A worker whose clock is wrong must not make a second email: leases and heartbeats read one clock."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from reports.fanout.progress import count
from reports.periods import Period
from tests.support.databases import load_users
from tests.support.processes import WorkerGroup, clock_ahead, run_cli
from tests.support.waiting import wait_until

# A fleet with many machines (so many clocks) runs on PostgreSQL; SQLite runs on one machine.
pytestmark = [pytest.mark.acceptance, pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)]

PERIOD = "2026-10"
USERS = 16
#: The run's claim lease and heartbeat timeout, in seconds: the fast worker's clock is ahead of both.
LEASE_SECONDS = 32
HEARTBEAT_TIMEOUT_SECONDS = 3
SKEW_SECONDS = 45
#: How long the fast worker is given to take messages from the others once it runs, in seconds.
TAKING_SECONDS = 5


def booted_at(group: WorkerGroup) -> datetime:
    """When the group's first log line says it booted, on the group's own clock."""
    return datetime.strptime(group.log()[1:24], "%Y-%m-%d %H:%M:%S,%f")


def test_a_worker_whose_clock_runs_ahead_of_the_lease_and_the_heartbeat_mails_every_user_once(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(
        settings,
        smtp_url=smtp_server.url,
        claim_lease_seconds=LEASE_SECONDS,
        smtp_timeout_seconds=LEASE_SECONDS - 2,
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_SECONDS * 1000,
        plan_page_size=USERS,  # one page: enqueued at once, so the two workers share it evenly
    )
    population = load_users(sessions, count=USERS, inactive_every=1000)
    handler = smtp_server.handler
    # Two workers with clocks that agree take every message (each no more than it sends at once)
    # and hold each in its send.
    handler.answering.clear()
    groups = [
        start_workers(settings, processes=1, threads=USERS // 2, env={"dramatiq_queue_prefetch": str(USERS // 2)})
        for _ in range(2)
    ]
    assert run_cli(settings, "trigger", PERIOD).returncode == 0
    wait_until(lambda: handler.arrived == USERS, timeout=30, what="every user's send to be in flight")

    # A third worker, its clock ahead, joins while they send, and is given time to take their messages.
    started = datetime.now()
    groups.append(start_workers(settings, processes=1, threads=4, env=clock_ahead(SKEW_SECONDS)))
    assert booted_at(groups[-1]) - started > timedelta(seconds=SKEW_SECONDS - 10), "its clock is not ahead"
    deadline = time.monotonic() + TAKING_SECONDS
    while handler.arrived == USERS and time.monotonic() < deadline:
        time.sleep(0.1)
    # A message taken from a live worker is sent a second time or, while the live worker's claim
    # holds, deferred (a line in the taker's log): the fast worker must show neither.
    arrived, deferred = handler.arrived, [line for line in groups[-1].log().splitlines() if "Deferred message" in line]
    handler.answering.set()
    assert (arrived, deferred) == (USERS, []), "the fast worker took messages the others still held"

    def complete() -> bool:
        with sessions.begin() as session:
            return count(session, Period.parse(PERIOD)).complete

    wait_until(complete, timeout=30, interval=0.2, what="the period to complete")
    # Counted once every worker has drained: a copy still sending when the period completed counts too.
    assert [group.stop() for group in groups] == [0, 0, 0]
    by_user = smtp_server.by_user()
    assert sorted(by_user) == population.active
    assert {user: len(messages) for user, messages in by_user.items() if len(messages) != 1} == {}
