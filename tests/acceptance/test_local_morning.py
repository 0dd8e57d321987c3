"""With ``SEND_AT_LOCAL_TIME=09:00``, real workers mail each user at 09:00 on their own clock, once.

The worker that runs the coordinator chain lives on a clock the test moves (libfaketime reading an
offset from a file): it is set a few seconds before each zone's morning in turn, so a day of
releases takes a minute. The bulk workers, Redis and PostgreSQL keep the real time, as they would
on the 1st. October 2026 ends on 1 November 00:00 UTC, and at 09:00 local Tashkent is at 04:00
UTC, Istanbul at 06:00, Los Angeles at 17:00 (its daylight saving ended at 02:00 local that day:
16:00 would be the offset the month ended with) and Kiritimati, whose 1st began while October
still ran in UTC, at 09:00 on its 2nd: 19:00 UTC on the 1st.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, text

from reports.fanout.coordinator import RELEASE_LOOK_SECONDS
from reports.fanout.progress import count
from reports.models import PeriodRun, ReportItem
from reports.periods import Period
from tests.support.databases import load_users
from tests.support.processes import MovableClock, run_cli
from tests.support.waiting import wait_until

# A fleet across machines and clocks runs on PostgreSQL; the release's SQLite path is in
# tests/integration/test_release.py.
pytestmark = [pytest.mark.acceptance, pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)]

PERIOD = "2026-10"
DUE = {
    "Asia/Tashkent": datetime(2026, 11, 1, 4, 0),
    "Europe/Istanbul": datetime(2026, 11, 1, 6, 0),
    "America/Los_Angeles": datetime(2026, 11, 1, 17, 0),
    "Pacific/Kiritimati": datetime(2026, 11, 1, 19, 0),
}
#: How far before a due time the test sets the chain's clock, in seconds.
LEAD_SECONDS = 4


@pytest.fixture
def morning_settings(settings, smtp_server):
    return replace(
        settings,
        smtp_url=smtp_server.url,
        send_at_local_time="09:00",
        heartbeat_timeout_ms=3000,
        claim_lease_seconds=20,
        plan_page_size=5,
    )


def load_users_in_zones(sessions, per_zone: int) -> dict[int, str]:  # type: ignore[no-untyped-def]
    population = load_users(sessions, count=per_zone * len(DUE), inactive_every=1000)
    zones = {user_id: list(DUE)[user_id % len(DUE)] for user_id in population.active}
    with sessions.begin() as session:
        for user_id, zone in zones.items():
            session.execute(text("UPDATE users SET time_zone = :zone WHERE id = :id"), {"zone": zone, "id": user_id})
    return zones


def released_at(sessions) -> dict[int, datetime]:  # type: ignore[no-untyped-def]
    """When each handed-out item was released, on the chain's clock."""
    with sessions.begin() as session:
        rows = session.execute(
            select(ReportItem.user_id, ReportItem.enqueued_at).where(ReportItem.enqueued_at.is_not(None))
        )
        return dict(rows.all())


def scheduled(sessions, at: datetime) -> int:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        waiting = count(session, Period.parse(PERIOD), at).scheduled
    assert waiting is not None
    return waiting


def chain_looked_at(sessions) -> datetime:  # type: ignore[no-untyped-def]
    """The chain's clock when it last looked for reports come due."""
    with sessions.begin() as session:
        return session.scalars(select(PeriodRun.updated_at).where(PeriodRun.period == PERIOD)).one()


def test_each_user_is_mailed_once_at_nine_on_their_own_clock(
    tmp_path, morning_settings, sessions, smtp_server, start_workers
):
    zones = load_users_in_zones(sessions, per_zone=3)
    clock = MovableClock(tmp_path / "chain-clock")
    clock.set(DUE["Asia/Tashkent"] - timedelta(minutes=30))
    start_workers(morning_settings, processes=1, threads=1, queues=("default",), env=clock.env())
    start_workers(morning_settings, processes=1, threads=4, queues=("bulk",))
    assert run_cli(morning_settings, "trigger", PERIOD).returncode == 0
    wait_until(lambda: scheduled(sessions, datetime(2026, 11, 1)) == len(zones), timeout=30, what="the walk")
    assert "scheduled" in json.loads(run_cli(morning_settings, "progress", PERIOD, "--json").stdout)

    mailed: set[int] = set()
    for zone, due in DUE.items():
        if zone == "America/Los_Angeles":
            # 09:00 by the offset Los Angeles had when October ended: a look then mails nobody.
            summer_nine = due - timedelta(hours=1) + timedelta(seconds=30)
            clock.set(summer_nine)
            wait_until(lambda at=summer_nine: chain_looked_at(sessions) >= at, timeout=30, what="a look at 16:00")
            assert set(smtp_server.by_user()) == mailed
        # Set a little before the zone's morning: a moved clock fires the chain's waiting look.
        clock.set(due - timedelta(seconds=LEAD_SECONDS))
        assert set(smtp_server.by_user()) == mailed, f"mailed before {zone}'s morning"
        mailed |= {user_id for user_id, its in zones.items() if its == zone}
        wait_until(
            lambda want=frozenset(mailed): set(smtp_server.by_user()) == want, timeout=30, what=f"{zone}'s morning"
        )
        released = released_at(sessions)
        for user_id in mailed:
            its_due = DUE[zones[user_id]]
            assert its_due <= released[user_id] < its_due + timedelta(seconds=60), (user_id, released[user_id])

    by_user = smtp_server.by_user()
    assert {user: len(messages) for user, messages in by_user.items()} == dict.fromkeys(zones, 1)
    assert scheduled(sessions, DUE["Asia/Tashkent"]) == 0


def released(sessions) -> int:  # type: ignore[no-untyped-def]
    return len(released_at(sessions))


def test_a_release_killed_mid_page_loses_nobody_and_mails_nobody_twice(
    tmp_path, morning_settings, sessions, smtp_server, start_workers
):
    population = load_users(sessions, count=300, inactive_every=1000)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET time_zone = 'Asia/Tashkent'"))
    # A low high-water mark keeps the release pausing on the backlog: a long release to kill in.
    settings = replace(morning_settings, plan_high_water=20, plan_pause_seconds=0.2)
    smtp_server.handler.delay_seconds = 0.01
    clock = MovableClock(tmp_path / "chain-clock")
    clock.set(DUE["Asia/Tashkent"] - timedelta(minutes=30))
    chain = start_workers(settings, processes=1, threads=1, queues=("default",), env=clock.env())
    start_workers(settings, processes=1, threads=4, queues=("bulk",))
    assert run_cli(settings, "trigger", PERIOD).returncode == 0
    wait_until(lambda: scheduled(sessions, datetime(2026, 11, 1)) == 300, timeout=30, what="the walk")

    clock.set(DUE["Asia/Tashkent"] - timedelta(seconds=1))
    # The chain's next look comes at once on the moved clock, and at the latest a look's interval
    # on; then its first pages. A minute in all was once too short on a loaded machine.
    wait_until(
        lambda: released(sessions) >= 40,
        timeout=RELEASE_LOOK_SECONDS + 60,
        interval=0.02,
        what="the release to be under way",
    )
    chain.kill()
    at_kill = released(sessions)
    assert at_kill < 300, "the release finished before the kill; the test proved nothing"

    start_workers(settings, processes=1, threads=1, queues=("default",), env=clock.env())

    def complete() -> bool:
        # A page stamped but never sent is found by reconcile once the queue has emptied.
        assert run_cli(settings, "reconcile", PERIOD, "--stuck-after", "2").returncode == 0
        with sessions.begin() as session:
            return count(session, Period.parse(PERIOD)).complete

    wait_until(complete, timeout=120, interval=2, what="the period to complete")
    by_user = smtp_server.by_user()
    # Only the chain was killed, with no send in flight: not even the duplicate window was open.
    assert {user: len(messages) for user, messages in by_user.items()} == dict.fromkeys(population.active, 1)
