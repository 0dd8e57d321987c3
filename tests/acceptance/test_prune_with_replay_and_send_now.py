"""A prune meets a dead-letter replay or a send-now, with real workers and a real SMTP server.

The interleaving is driven, not timed: the prune runs in the test with a tiny batch size, and
the operator's command runs between its first two batches (the prune's ``should_stop`` hook).
What is checked is what the mail server received: who, how many times, with which Message-ID.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from reports.cli.prune import describe
from reports.clock import utcnow
from reports.fanout.progress import count
from reports.ops import retention
from reports.periods import Period
from reports.settings import Settings
from tests.acceptance.test_priority_and_admin import (
    assert_each_mailed_once,
    cli_ok,
    item_state,
    monthly_id,
    queue_settled,
    request_id_in,
)
from tests.support.databases import load_users
from tests.support.periods import month_from_now
from tests.support.processes import WorkerGroup
from tests.support.smtp import SmtpServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

#: Old enough for `reports prune --older-than-months 12`.
OLD = month_from_now(-20)
USERS = [1, 2, 3, 4, 5, 6]
#: The user whose monthly message died (an address that cannot be one), fixed since.
DEAD = 3


def dead_letters(settings: Settings) -> list[dict]:
    return json.loads(cli_ok(settings, "dlq", "list", "--json"))


def prune_running_between_batches(settings: Settings, sessions: sessionmaker[Session], *command: str):
    """Prune OLD two rows a batch, running ``reports COMMAND`` once after the first batch."""
    outputs: list[str] = []

    def run_command_once() -> bool:
        if not outputs:
            outputs.append(cli_ok(settings, *command))
        return False

    result = retention.prune(
        sessions, before=retention.cutoff(utcnow(), 12), batch_size=2, should_stop=run_command_once
    )
    assert len(outputs) == 1
    return result, outputs[0]


@pytest.fixture
def finished(settings: Settings, sessions: sessionmaker[Session], smtp_server: SmtpServer, start_workers) -> Settings:
    """OLD run to the end: users 1, 2, 4, 5 and 6 mailed once, user 3's message dead; no worker left."""
    settings = replace(settings, smtp_url=smtp_server.url)
    load_users(sessions, count=len(USERS), period=OLD, inactive_every=100)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'bad@@example.test' WHERE id = :id"), {"id": DEAD})
    workers: WorkerGroup = start_workers(settings, processes=1, threads=4)
    cli_ok(settings, "trigger", OLD)

    def done() -> bool:
        with sessions() as session:
            return count(session, Period.parse(OLD)).complete

    wait_until(done, timeout=60, what=f"{OLD} to complete")
    workers.stop()
    assert [letter["user_id"] for letter in dead_letters(settings)] == [DEAD]
    assert_each_mailed_once(smtp_server, [u for u in USERS if u != DEAD], period=OLD)
    with sessions.begin() as session:
        session.execute(
            text("UPDATE users SET email = :email WHERE id = :id"), {"email": "user3@example.test", "id": DEAD}
        )
    return settings


def test_a_dead_letter_replayed_during_a_prune_mails_its_user_once_with_the_monthly_message_id(
    finished, sessions, smtp_server, start_workers
):
    settings = finished
    result, replayed = prune_running_between_batches(settings, sessions, "dlq", "replay", "--period", OLD)
    assert "Replayed 1 dead letter(s)" in replayed

    start_workers(settings, processes=1, threads=4)
    # Mailed, or dead again (on a prune that deleted the item the replay needs).
    wait_until(
        lambda: smtp_server.by_user().get(DEAD) or dead_letters(settings), timeout=30, what="the replayed message"
    )
    wait_until(lambda: queue_settled(settings, "bulk"), timeout=30, what="the bulk queue to settle")
    assert dead_letters(settings) == []
    assert_each_mailed_once(smtp_server, USERS, period=OLD)
    assert item_state(sessions, DEAD, OLD) == "delivered"
    assert describe(result, dry_run=False)[0].endswith("stopped there, a replay or a send-now made its run unfinished.")

    # The period is finished again: the next prune deletes the rest.
    pruned = cli_ok(settings, "prune", "--older-than-months", "12")
    assert f"{OLD}: deleted" in pruned and "stopped there" not in pruned
    assert item_state(sessions, DEAD, OLD) is None


def test_send_now_during_and_after_a_prune_is_a_new_email_with_its_own_message_id(
    finished, sessions, smtp_server, start_workers
):
    settings = finished
    # Requested between two batches: the prune stops there, and the request is its own email.
    _result, requested = prune_running_between_batches(settings, sessions, "send-now", "4", OLD)
    during = request_id_in(requested)
    start_workers(settings, processes=1, threads=4)
    wait_until(lambda: len(smtp_server.by_user()[4]) == 2, timeout=30, what="the send-now during the prune")
    wait_until(lambda: queue_settled(settings, "critical"), timeout=30, what="the send-now to be recorded")

    # After a whole prune: user 2's monthly email went out, so the send-now is a new one; user 3's
    # never did (its message died), so the send-now is the monthly email, and a replay sends nothing.
    pruned = cli_ok(settings, "prune", "--older-than-months", "12")
    assert f"{OLD}: deleted" in pruned and "stopped there" not in pruned
    assert item_state(sessions, 2, OLD) is None
    after = request_id_in(cli_ok(settings, "send-now", "2", OLD))
    cli_ok(settings, "send-now", str(DEAD), OLD)
    wait_until(
        lambda: len(smtp_server.by_user()[2]) == 2 and smtp_server.by_user().get(DEAD), timeout=30, what="both sends"
    )
    assert "Replayed 1 dead letter(s)" in cli_ok(settings, "dlq", "replay", "--period", OLD)
    # The replayed monthly message goes to the bulk queue (the send-now made the item delivered
    # before it ran, so the item's state cannot tell it ran): what it sent is known once it is acked.
    wait_until(
        lambda: queue_settled(settings, "bulk") and queue_settled(settings, "critical"),
        timeout=30,
        what="the replayed message and the send-nows to finish",
    )
    assert item_state(sessions, DEAD, OLD) == "delivered"

    ids = {user: [m["Message-ID"].strip() for m in ms] for user, ms in smtp_server.by_user().items()}
    assert ids == {
        1: [monthly_id(1, OLD)],
        2: [monthly_id(2, OLD), f"<report.{OLD}.2.{after}@reports.test>"],
        DEAD: [monthly_id(DEAD, OLD)],
        4: [monthly_id(4, OLD), f"<report.{OLD}.4.{during}@reports.test>"],
        5: [monthly_id(5, OLD)],
        6: [monthly_id(6, OLD)],
    }
    assert dead_letters(settings) == []
