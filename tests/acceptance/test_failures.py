"""Failure handling with real workers, a real broker and a fault-injecting SMTP server.

Bounces, deferrals, a provider outage behind the circuit breaker, malformed payloads, replay of
dead letters and the rate-limited alert webhook, each as an operator would see them: through the
mail provider, the ``reports`` command and the worker log.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from typing import Any

import dramatiq
import pytest
import redis
from sqlalchemy import make_url, text

from reports.clock import utcnow
from reports.dead_message import DeadMessage
from reports.errors import BadInput
from reports.failures import dead_letters
from reports.fanout import coordinator, runs
from reports.fanout.progress import count
from reports.models import DeadLetterReason
from reports.periods import Period
from reports.queue import InMemoryQueue
from tests.support.broker import dead_in_broker, held_by_workers, publish_message, publish_raw, queued_messages
from tests.support.databases import load_users
from tests.support.processes import run_cli
from tests.support.proxy import tcp_proxy
from tests.support.rabbitmq import queue_depths
from tests.support.smtp import DeadProvider
from tests.support.sqs import queue_depths as sqs_queue_depths
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"
BOUNCE = "550 5.1.1 No such user"
TRY_LATER = "451 4.3.0 Try again later"


# --- helpers ---------------------------------------------------------------------------------


def user_id_of(address: str) -> int:
    """``user17@example.test`` → 17 (the addresses ``load_users`` gives)."""
    return int(address.split("@", 1)[0].removeprefix("user"))


def progress(sessions) -> dict[str, Any] | None:
    """The period's progress read straight from the database (cheap enough to poll)."""
    with sessions() as session:
        try:
            return count(session, Period.parse(PERIOD)).as_dict()
        except BadInput:
            return None


def wait_complete(sessions, *, timeout: float = 60) -> dict[str, Any]:
    return wait_until(
        lambda: (p := progress(sessions)) and p["complete"] and p, timeout=timeout, what="the period to complete"
    )


def progress_json(settings) -> dict[str, Any]:
    result = run_cli(settings, "progress", PERIOD, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def dlq_list(settings, *args: str) -> list[dict[str, Any]]:
    result = run_cli(settings, "dlq", "list", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def dead_letters_stored(sessions, cause: DeadLetterReason | None = None) -> int:
    """Dead letters in the database, read directly: a wait polls this, not a command a process each."""
    with sessions() as session:
        return dead_letters.count(session, dead_letters.Filter(cause=cause))[0]


def trigger(settings) -> None:
    result = run_cli(settings, "trigger", PERIOD)
    assert result.returncode == 0, result.stderr


def xq_keys(settings) -> list[bytes]:
    return redis.Redis.from_url(settings.broker_url).keys(f"{settings.broker_namespace}:*.XQ")


def plan_without_enqueueing(settings, sessions) -> None:
    """Trigger and walk the period without enqueueing anything: every active user has a pending
    item, and only the messages a test puts on the queue itself are there."""
    period = Period.parse(PERIOD)
    with sessions.begin() as session:
        runs.trigger(session, period, template_version=settings.template_version, now=utcnow())
    outcome = coordinator.walk_slice(
        sessions, period, InMemoryQueue(), page_size=settings.plan_page_size, budget_seconds=30
    )
    assert outcome.planned


def dead_summary(letters: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a failed assertion should show about dead letters: who, and why."""
    return [(letter["user_id"], letter["error_class"], letter["error_message"][:120]) for letter in letters]


def assert_each_mailed_once(smtp_server, user_ids: list[int]) -> None:
    by_user = smtp_server.by_user()
    assert sorted(by_user) == sorted(user_ids)
    twice = {user_id: len(messages) for user_id, messages in by_user.items() if len(messages) != 1}
    assert not twice, f"users mailed more than once: {twice}"


# --- permanent and transient SMTP replies ----------------------------------------------------


@pytest.mark.both_brokers
def test_a_550_bounce_is_a_dead_letter_after_one_attempt_and_everyone_else_is_mailed_once(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, min_backoff_ms=100, max_backoff_ms=1_000)
    population = load_users(sessions, count=30)
    bounced = [u for u in population.active if u % 7 == 0]
    assert bounced, "the population must contain users to bounce"
    smtp_server.handler.fault = lambda rcpt, attempt: BOUNCE if user_id_of(rcpt) % 7 == 0 else None
    start_workers(settings, processes=2, threads=4)

    trigger(settings)
    wait_complete(sessions)
    time.sleep(1)  # room for a wrong retry to show up

    letters = dlq_list(settings)
    assert sorted(letter["user_id"] for letter in letters) == bounced, dead_summary(letters)
    assert progress_json(settings) == {
        "period": PERIOD,
        "total": len(population.active),
        "planned": True,
        "delivered": len(population.active) - len(bounced),
        "skipped": 0,
        "dead": len(bounced),
        "pending": 0,
        "state": "active",
        "complete": True,
    }
    assert_each_mailed_once(smtp_server, [u for u in population.active if u not in bounced])
    attempts = smtp_server.handler.attempts
    assert {u: attempts[f"user{u}@example.test"] for u in bounced} == {u: 1 for u in bounced}
    for letter in letters:
        assert (letter["period"], letter["actor"], letter["queue"]) == (PERIOD, "build_report", "bulk")
        assert (letter["attempts"], letter["reason"], letter["error_class"]) == (1, "permanent", "MailRejected")
        assert "550" in letter["error_message"]


@pytest.mark.both_brokers
def test_451_deferrals_are_retried_until_everyone_is_mailed_exactly_once(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, max_retries=5, min_backoff_ms=100, max_backoff_ms=1_000)
    population = load_users(sessions, count=30)
    deferred = [u for u in population.active if u % 10 < 3]
    assert deferred
    smtp_server.handler.fault = lambda rcpt, attempt: TRY_LATER if user_id_of(rcpt) % 10 < 3 and attempt <= 2 else None
    start_workers(settings, processes=2, threads=4)

    trigger(settings)
    final = wait_complete(sessions)
    time.sleep(1)

    assert (final["delivered"], final["dead"], final["total"]) == (len(population.active), 0, len(population.active)), (
        dead_summary(dlq_list(settings))
    )
    assert_each_mailed_once(smtp_server, population.active)
    attempts = smtp_server.handler.attempts
    assert {u: attempts[f"user{u}@example.test"] for u in deferred} == {u: 3 for u in deferred}
    others = [u for u in population.active if u not in deferred]
    assert {u: attempts[f"user{u}@example.test"] for u in others} == {u: 1 for u in others}
    assert dlq_list(settings, "--replayed") == []


@pytest.mark.both_brokers
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_bounce_while_the_database_is_down_is_a_dead_letter_once_it_is_back_without_a_restart(
    settings, sessions, smtp_server, start_workers
):
    population = load_users(sessions, count=6)
    bounced = max(population.active)  # mailed last: one worker thread takes the messages in order
    direct = make_url(settings.database_url)
    with tcp_proxy(direct.port) as database:
        through_proxy = direct.set(port=database.port).render_as_string(hide_password=False)
        workers = replace(settings, smtp_url=smtp_server.url, database_url=through_proxy, dead_letter_sweep_seconds=1)

        def crash_then_bounce(rcpt: str, attempt: int) -> str | None:
            if user_id_of(rcpt) != bounced:
                return None
            database.cut()  # the database goes down as the provider refuses the address
            return BOUNCE

        smtp_server.handler.fault = crash_then_bounce
        start_workers(workers, processes=1, threads=1)
        trigger(settings)
        # The dead letter could not be stored: the broker keeps it in its own dead-letter queue.
        wait_until(lambda: dead_in_broker(settings) == 1, timeout=30, what="the bounce in the broker's .XQ")
        database.restore()

        final = wait_complete(sessions, timeout=20)

    assert (final["delivered"], final["dead"]) == (len(population.active) - 1, 1)
    assert [letter["user_id"] for letter in dlq_list(settings)] == [bounced]
    assert dead_in_broker(settings) == 0
    assert_each_mailed_once(smtp_server, [u for u in population.active if u != bounced])
    assert smtp_server.handler.attempts[f"user{bounced}@example.test"] == 1


# --- provider outage behind the circuit breaker ----------------------------------------------


@pytest.mark.both_brokers
def test_an_outage_longer_than_the_retry_budget_opens_the_breaker_and_loses_no_email(
    settings, sessions, smtp_server, start_workers
):
    processes, threads, outage_seconds = 2, 4, 10.0
    settings = replace(
        settings,
        smtp_url=smtp_server.url,
        max_retries=2,
        min_backoff_ms=100,
        max_backoff_ms=400,
        breaker_failure_threshold=3,
        breaker_window_seconds=10,
        breaker_cooldown_seconds=2,
        # The dead provider drops every connection at once, so no deadline runs out in the outage;
        # after it, every held-back send goes at once, and on a loaded machine a short deadline
        # could pass while the provider answers the final ".": the duplicate window, not the outage.
        # The lease leaves a few seconds over a whole send, so a send held back by the breaker or
        # the send rate still has lease enough for one when its turn comes.
        smtp_timeout_seconds=10,
        claim_lease_seconds=15,
        sqs_visibility_timeout_seconds=15,
    )
    population = load_users(sessions, count=40)
    group = start_workers(settings, processes=processes, threads=threads)

    smtp_server.stop()
    dead = DeadProvider(smtp_server.port)
    try:
        trigger(settings)
        outage_started = time.monotonic()
        wait_until(lambda: dead.connections > 0, timeout=20, what="the first attempt at the dead provider")
        time.sleep(max(0.0, outage_seconds - (time.monotonic() - outage_started)))
        outage = time.monotonic() - outage_started
        connections = dead.connections
        assert progress(sessions)["delivered"] == 0
    finally:
        dead.stop()
        smtp_server.start()

    final = wait_complete(sessions, timeout=60)
    time.sleep(1)

    assert (final["delivered"], final["dead"]) == (len(population.active), 0), dead_summary(dlq_list(settings))
    assert dlq_list(settings, "--replayed") == []
    assert_each_mailed_once(smtp_server, population.active)

    threshold, cooldown = settings.breaker_failure_threshold, settings.breaker_cooldown_seconds
    bound = threshold + processes * threads + math.ceil(outage / cooldown) * 2 + 5
    unguarded = len(population.active) * (settings.max_retries + 1)
    print(
        f"{connections} connection attempts at the dead provider in {outage:.1f}s "
        f"(bound {bound}; without a breaker at least {unguarded})"
    )
    assert threshold <= connections <= bound
    assert connections < unguarded / 3

    log = group.log()
    assert any("Circuit breaker" in line and "-> open" in line for line in log.splitlines()), log[-5000:]


# --- malformed payloads ----------------------------------------------------------------------


@pytest.mark.both_brokers
def test_malformed_payloads_become_dead_letters_with_a_clear_reason_and_the_worker_goes_on(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, min_backoff_ms=100, max_backoff_ms=1_000)
    load_users(sessions, count=2, inactive_every=100)
    plan_without_enqueueing(settings, sessions)
    group = start_workers(settings, processes=2, threads=2)

    valid = (PERIOD, 2, "v1")
    malformed: dict[str, tuple[str, tuple[Any, ...], dict[str, Any], str, str]] = {
        # name: (actor, args, kwargs, error class, text the error message must contain)
        "missing user_id": ("build_report", (PERIOD, "v1"), {}, "InvalidPayload", "Expected 3"),
        "a positional too many": ("build_report", (*valid, "FREE"), {}, "InvalidPayload", "Expected 3"),
        "user_id as a string": ("build_report", (PERIOD, "2", "v1"), {}, "InvalidPayload", "user_id"),
        "malformed period": ("build_report", ("2026-13", 2, "v1"), {}, "InvalidPayload", "2026-13"),
        "named fields": (
            "build_report",
            (),
            {"period": PERIOD, "user_id": 2, "template_version": "v1"},
            "InvalidPayload",
            "positionally",
        ),
        "positional and named": ("build_report", (PERIOD,), {"user_id": 2}, "InvalidPayload", "positionally"),
        "unknown template": ("build_report", (PERIOD, 1, "v999"), {}, "UnknownTemplateVersion", "v999"),
    }
    # As raw bytes on the wire: such payloads come from an older deploy or another producer, not
    # from this code's senders, which build every message from a parsed job.
    ids: dict[str, str] = {}
    for name, (actor, args, kwargs, _, _) in malformed.items():
        message = dramatiq.Message(queue_name="bulk", actor_name=actor, args=args, kwargs=kwargs, options={})
        publish_message(settings, message)
        ids[message.message_id] = name
    publish_message(
        settings, dramatiq.Message(queue_name="bulk", actor_name="build_report", args=valid, kwargs={}, options={})
    )

    wait_until(lambda: (p := progress(sessions)) and p["complete"], timeout=30, what="both items to finish")
    wait_until(lambda: dead_letters_stored(sessions) >= len(malformed), timeout=30, what="every dead letter")
    time.sleep(1)

    letters = {ids.get(letter["message_id"], letter["message_id"]): letter for letter in dlq_list(settings)}
    assert sorted(letters) == sorted(malformed)
    for name, (actor, _, _, error_class, needle) in malformed.items():
        letter = letters[name]
        assert (letter["actor"], letter["queue"], letter["error_class"]) == (actor, "bulk", error_class), name
        assert needle in letter["error_message"], (name, letter["error_message"])
        assert letter["attempts"] == 1, (name, letter)
        # What `reports dlq list --reason` filters on: retrying cannot fix any of these.
        assert letter["reason"] == "permanent", (name, letter)
    assert (letters["unknown template"]["period"], letters["unknown template"]["user_id"]) == (PERIOD, 1)

    final = progress_json(settings)
    assert (final["delivered"], final["dead"], final["complete"]) == (1, 1, True)
    assert_each_mailed_once(smtp_server, [2])
    assert group.process.poll() is None, group.log()[-5000:]
    assert group.log().count("Worker process is ready") == 2, "a worker process was restarted"
    assert dead_in_broker(settings) == 0
    assert queued_messages(settings.broker_url, settings.broker_namespace, "bulk") == 0


@pytest.mark.both_brokers
def test_a_message_for_an_unknown_actor_becomes_a_broker_dead_letter_and_the_worker_goes_on(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    load_users(sessions, count=1, inactive_every=100)
    plan_without_enqueueing(settings, sessions)
    group = start_workers(settings, processes=1, threads=2)

    job = (PERIOD, 1, "v1")
    unknown = dramatiq.Message(queue_name="bulk", actor_name="no_such_actor", args=job, kwargs={}, options={})
    publish_message(settings, unknown)
    publish_message(
        settings, dramatiq.Message(queue_name="bulk", actor_name="build_report", args=job, kwargs={}, options={})
    )

    final = wait_complete(sessions)
    assert (final["delivered"], final["dead"]) == (1, 0)
    assert_each_mailed_once(smtp_server, [1])
    wait_until(lambda: dead_letters_stored(sessions), timeout=20, what="the unknown actor's dead letter")
    letters = dlq_list(settings)
    assert [(letter["message_id"], letter["actor"], letter["queue"]) for letter in letters] == [
        (unknown.message_id, "no_such_actor", "bulk")
    ]
    assert (letters[0]["reason"], letters[0]["error_class"]) == ("broker", "BrokerDeadLetter")
    assert "actor" in letters[0]["error_message"], letters[0]
    assert group.process.poll() is None, group.log()[-5000:]
    assert dead_in_broker(settings) == 0


@pytest.mark.both_brokers
def test_an_undecodable_raw_message_becomes_a_dead_letter_and_the_worker_goes_on(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=12, inactive_every=100)
    raw = {"raw-not-json": b"not json", "raw-not-utf8": b"\xff\xfe{", "raw-not-a-message": b'{"args": 1}'}
    # The id each is known by: the one given, except on SQS, which draws its own.
    ids = {name: publish_raw(settings, "bulk", body, message_id=name) for name, body in raw.items()}
    group = start_workers(settings, processes=1, threads=2)
    trigger(settings)

    final = wait_complete(sessions)
    assert (final["delivered"], final["dead"]) == (len(population.active), 0)
    assert_each_mailed_once(smtp_server, population.active)
    wait_until(
        lambda: dead_letters_stored(sessions, DeadLetterReason.UNDECODABLE) >= 3,
        timeout=30,
        what="three undecodable dead letters",
    )
    letters = dlq_list(settings, "--reason", "undecodable")
    assert sorted(letter["message_id"] for letter in letters) == sorted(ids.values())
    by_id = {letter["message_id"]: letter for letter in letters}
    assert "not json" in by_id[ids["raw-not-json"]]["error_message"]
    assert "\ufffd" in by_id[ids["raw-not-utf8"]]["error_message"]
    assert all((letter["queue"], letter["reason"]) == ("bulk", "undecodable") for letter in letters)

    log = group.log()
    assert "Restarting consumer" not in log and "unexpected error" not in log, log[-5000:]
    assert group.process.poll() is None, log[-5000:]
    # Nothing is left in the broker: not in the queue, not held by the worker, not in .XQ.
    wait_until(lambda: bulk_left(settings) == {}, timeout=10, what="the bulk queue to be empty")


def bulk_left(settings) -> dict[str, int]:
    """What the bulk queue still has, by where it is (only places with something)."""
    if settings.broker_is_rabbitmq:
        ready, delayed, dead = queue_depths(settings.broker_url, "bulk")
        left = {"ready": ready, "delayed": delayed, "held": held_by_workers(settings, "bulk"), "XQ": dead}
    elif settings.broker_is_sqs:
        ready, delayed, in_flight, dead = sqs_queue_depths(settings.broker_url, "bulk")
        left = {"ready": ready, "delayed": delayed, "held": in_flight, "dead-letter queue": dead}
    else:
        client = redis.Redis.from_url(settings.broker_url)
        bulk = f"{settings.broker_namespace}:bulk"
        acks = client.keys(f"{settings.broker_namespace}:__acks__.*")
        left = {
            "ready": client.llen(bulk),
            "bodies": client.hlen(f"{bulk}.msgs"),
            "held": sum(client.scard(key) for key in acks),
            "XQ": len(xq_keys(settings)),
        }
    return {place: count for place, count in left.items() if count}


# --- replay ----------------------------------------------------------------------------------


@pytest.mark.both_brokers
def test_replay_mails_a_fixed_user_once_and_a_second_replay_sends_nothing(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, min_backoff_ms=100, max_backoff_ms=1_000)
    population = load_users(sessions, count=6, inactive_every=100)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'bad@@example.test' WHERE id = 3"))
    bouncing = {"user5@example.test"}
    smtp_server.handler.fault = lambda rcpt, attempt: BOUNCE if rcpt in bouncing else None
    start_workers(settings, processes=2, threads=4)

    trigger(settings)
    first = wait_complete(sessions)
    assert (first["delivered"], first["dead"]) == (4, 2)
    letters = {letter["user_id"]: letter for letter in dlq_list(settings)}
    assert sorted(letters) == [3, 5]
    assert letters[3]["error_class"] == "InvalidRecipient"
    assert letters[3]["reason"] == "permanent"
    assert "bad@@" not in letters[3]["error_message"]
    assert letters[5]["error_class"] == "MailRejected"
    assert_each_mailed_once(smtp_server, [1, 2, 4, 6])

    # Fix the address as an operator would, and replay that one dead letter.
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'user3@example.test' WHERE id = 3"))
    replayed = run_cli(settings, "dlq", "replay", "--id", str(letters[3]["id"]))
    assert replayed.returncode == 0, replayed.stderr
    assert "Replayed 1 dead letter(s)" in replayed.stdout
    after_fix = wait_until(
        lambda: (p := progress(sessions)) and p["delivered"] == 5 and p, timeout=30, what="user 3 to be delivered"
    )
    assert (after_fix["dead"], after_fix["pending"]) == (1, 0)
    assert_each_mailed_once(smtp_server, [1, 2, 3, 4, 6])

    # The provider takes user 5 again: replay the period (only what is not replayed yet).
    bouncing.clear()
    replayed = run_cli(settings, "dlq", "replay", "--period", PERIOD)
    assert replayed.returncode == 0, replayed.stderr
    assert f"Replayed 1 dead letter(s): {letters[5]['id']}" in replayed.stdout
    done = wait_until(
        lambda: (p := progress(sessions)) and p["delivered"] == 6 and p, timeout=30, what="user 5 to be delivered"
    )
    assert (done["dead"], done["complete"]) == (0, True)
    assert_each_mailed_once(smtp_server, population.active)

    # Replaying again sends nothing.
    for args in (("--id", str(letters[3]["id"])), ("--all",)):
        again = run_cli(settings, "dlq", "replay", *args)
        assert again.returncode == 0, again.stderr
        assert "Replayed 0 dead letter(s)" in again.stdout, again.stdout
    assert dlq_list(settings) == []
    assert all(letter["replayed_at"] for letter in dlq_list(settings, "--replayed"))

    # A dead letter for a user who was already mailed: the replay passes the same gate, sends nothing.
    now_ms = int(time.time() * 1000)
    stale = DeadMessage(
        message_id="stale-copy-of-user-1",
        actor="build_report",
        queue="bulk",
        args=(PERIOD, 1, "v1"),
        kwargs={},
        attempts=6,
        reason="retries_exhausted",
        error_class="MailDeferred",
        error_message="SMTP 451: Try again later",
        traceback="",
        first_failed_ms=now_ms - 60_000,
        died_ms=now_ms,
    )
    with sessions.begin() as session:
        assert dead_letters.record(session, stale)
    [stale_letter] = dlq_list(settings)
    replayed = run_cli(settings, "dlq", "replay", "--id", str(stale_letter["id"]))
    assert replayed.returncode == 0, replayed.stderr
    assert "Replayed 1 dead letter(s)" in replayed.stdout
    wait_until(
        lambda: queued_messages(settings.broker_url, settings.broker_namespace, "bulk") == 0,
        timeout=20,
        what="the replayed message to be consumed",
    )
    time.sleep(1.5)
    assert_each_mailed_once(smtp_server, population.active)
    assert progress_json(settings) == {
        "period": PERIOD,
        "total": 6,
        "planned": True,
        "delivered": 6,
        "skipped": 0,
        "dead": 0,
        "pending": 0,
        "state": "active",
        "complete": True,
    }


# --- the alert webhook -----------------------------------------------------------------------


@pytest.mark.both_brokers
def test_dead_letters_raise_few_webhook_posts_and_one_id_only_error_line_each(
    settings, sessions, smtp_server, start_workers, webhook
):
    window = 2.0
    settings = replace(
        settings,
        smtp_url=smtp_server.url,
        min_backoff_ms=100,
        max_backoff_ms=1_000,
        alert_webhook_url=f"http://127.0.0.1:{webhook.server_port}/hooks/dead-letters",
        alert_window_seconds=window,
    )
    names = {u: f"Zebediah Quux{u}" for u in range(1, 41)}
    population = load_users(sessions, count=40, inactive_every=100, names=names)
    bounced = [u for u in population.active if u % 4 != 0]
    assert len(bounced) == 30
    smtp_server.handler.fault = lambda rcpt, attempt: BOUNCE if user_id_of(rcpt) % 4 != 0 else None
    group = start_workers(settings, processes=2, threads=4)

    trigger(settings)
    final = wait_complete(sessions)
    unexpected = dead_summary([letter for letter in dlq_list(settings) if letter["user_id"] not in bounced])
    assert (final["dead"], final["delivered"], unexpected) == (30, 10, [])
    time.sleep(2 * window + 1)

    posts = [body for _, body in webhook.posts]  # type: ignore[attr-defined]
    print(f"{len(posts)} webhook post(s): {[p['dead_letters'] for p in posts]}")
    assert sum(p["dead_letters"] for p in posts) == len(bounced), posts
    assert 1 <= len(posts) <= 4, posts
    assert all(set(p["by_reason"]) == {"permanent:MailRejected"} for p in posts), posts
    # Nothing more once everything has been told.
    time.sleep(window)
    assert len(webhook.posts) == len(posts)  # type: ignore[attr-defined]

    letters = dlq_list(settings)
    assert sorted(letter["user_id"] for letter in letters) == bounced
    lines = [line for line in group.log().splitlines() if "Dead letter" in line and "ERROR" in line]
    assert len(lines) == len(bounced), "\n".join(lines)
    for letter in letters:
        # One line per dead letter, naming the IDs it was for (parsed from the positional payload).
        (line,) = [line for line in lines if letter["message_id"] in line]
        assert f"period={letter['period']} user_id={letter['user_id']}" in line, line
    for line in lines:
        assert "@" not in line, line
        assert "Zebediah" not in line and "Quux" not in line, line


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_worker_that_starts_posts_the_dead_letters_a_stopped_one_left_untold(settings, start_workers, webhook):
    # A worker counted two dead letters in a window whose post had gone out, and was stopped
    # (a deploy) before the window ended: the next worker to start tells them.
    settings = replace(
        settings,
        alert_webhook_url=f"http://127.0.0.1:{webhook.server_port}/hooks/dead-letters",
        alert_window_seconds=1.0,
    )
    client = redis.Redis.from_url(settings.shared_redis_url)
    keys = f"{settings.broker_namespace}:alerts"
    client.incrby(f"{keys}:pending", 2)
    client.hincrby(f"{keys}:reasons", "permanent:MailRejected", 2)
    client.lpush(f"{keys}:sample", "m-1", "m-2")
    client.close()

    start_workers(settings, processes=1, threads=1)

    wait_until(lambda: webhook.posts, timeout=10, what="the post of what the stopped worker left")  # type: ignore[attr-defined]
    [(_, post)] = webhook.posts  # type: ignore[attr-defined]
    assert (post["dead_letters"], post["sample_message_ids"]) == (2, ["m-2", "m-1"])
