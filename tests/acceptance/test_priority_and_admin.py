"""Priority and admin operations with real worker pools (issue 5: "Priority", "Admin operations").

``reports send-now`` on the critical queue (one email per request; the monthly email itself when
that never went out), bad input rejected with nothing enqueued, ``reports cancel`` and the resume
by ``reports trigger``, the ``reports periods`` overview, and a critical message overtaking a
50,000-message bulk backlog.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import termios
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.fanout import coordinator, runs
from reports.jobs import BULK_QUEUE, CRITICAL_QUEUE, DEFAULT_QUEUE, SEND_NOW, SendNowJob
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import build_broker, send
from reports.worker.queues import queue_for
from tests.support.broker import held_by_workers, queued_messages
from tests.support.databases import load_users
from tests.support.environment import REPO
from tests.support.periods import month_from_now
from tests.support.processes import WorkerGroup, free_port, run_cli, wait_for_progress
from tests.support.smtp import SmtpServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

#: To keep the suite short, most tests with worker pools run on PostgreSQL only, the send-now
#: idempotency test on both databases, and the bad-input test (no workers) on SQLite.
ON_POSTGRESQL = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
ON_SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

PERIOD = "2026-10"
DOMAIN = "reports.test"
REQUEST_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PERIODS_KEYS = {
    "period",
    "state",
    "planned",
    "total",
    "delivered",
    "skipped",
    "dead",
    "pending",
    "complete",
    "triggered_at",
}


CURRENT_MONTH = month_from_now(0)
NEXT_MONTH = month_from_now(1)


# --- helpers ---------------------------------------------------------------------------------


def monthly_id(user_id: int, period: str = PERIOD) -> str:
    return f"<report.{period}.{user_id}@{DOMAIN}>"


def request_id_in(stdout: str) -> str:
    found = set(REQUEST_ID.findall(stdout))
    assert len(found) == 1, f"expected one request id in {stdout!r}"
    return found.pop()


def cli_ok(settings: Settings, *args: str) -> str:
    result = run_cli(settings, *args)
    assert result.returncode == 0, f"reports {' '.join(args)}: exit {result.returncode}\n{result.stderr}"
    return result.stdout


def progress_json(settings: Settings, period: str = PERIOD) -> dict:
    return json.loads(cli_ok(settings, "progress", period, "--json"))


def periods_json(settings: Settings) -> list[dict]:
    return json.loads(cli_ok(settings, "periods", "--json"))


def messages_with(smtp_server: SmtpServer, needle: str) -> list[EmailMessage]:
    return [m for m in smtp_server.messages if needle in str(m["Message-ID"])]


def waiting(settings: Settings, queue: str) -> int:
    """Messages ready or delayed in ``queue``, on either broker."""
    return queued_messages(settings.broker_url, settings.broker_namespace, queue)


def queue_settled(settings: Settings, queue: str) -> bool:
    """Nothing of ``queue`` is waiting, delayed, or held (fetched but not acked) by any worker."""
    if settings.broker_is_rabbitmq or settings.broker_is_sqs:
        return waiting(settings, queue) == 0 and held_by_workers(settings, queue) == 0
    client = redis.Redis.from_url(settings.broker_url)
    ns = settings.broker_namespace
    if client.llen(f"{ns}:{queue}") or client.llen(f"{ns}:{queue}.DQ"):
        return False
    for key in client.scan_iter(match=f"{ns}:__acks__.*", count=1000):
        name = key.decode()
        if name.endswith((f".{queue}", f".{queue}.DQ")) and client.scard(key):
            return False
    return True


def item_state(sessions: sessionmaker[Session], user_id: int, period: str = PERIOD) -> str | None:
    with sessions() as session:
        return session.execute(
            text("SELECT state FROM report_items WHERE period = :p AND user_id = :u"), {"p": period, "u": user_id}
        ).scalar()


def count_rows(sessions: sessionmaker[Session], table: str) -> int:
    with sessions() as session:
        return session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_terminal(settings: Settings, *args: str, columns: int, timeout: float = 60) -> tuple[int, str]:
    """Run ``reports ARGS`` on a pseudo-terminal ``columns`` wide, as an operator at a shell does."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in {**os.environ, **settings.as_environ()}.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    process = subprocess.Popen(
        [sys.executable, "-m", "reports", *args],
        env=env,
        cwd=REPO,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    output, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the command closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        code = process.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return code, ANSI.sub("", output.decode(errors="replace")).replace("\r\n", "\n")


def stop_all(*groups: WorkerGroup, timeout: float = 20) -> None:
    """SIGTERM every group at once and wait for them: the drains overlap instead of adding up."""
    for group in groups:
        if group.process.poll() is None:
            group.process.send_signal(signal.SIGTERM)
    for group in groups:
        try:
            group.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            group.kill()


def assert_each_mailed_once(smtp_server: SmtpServer, users: list[int], period: str = PERIOD) -> None:
    by_user = smtp_server.by_user()
    assert sorted(by_user) == sorted(users)
    twice = {u: [m["Message-ID"] for m in ms] for u, ms in by_user.items() if len(ms) != 1}
    assert twice == {}, f"users mailed more than once: {twice}"
    for user_id, [message] in by_user.items():
        assert message["Message-ID"].strip() == monthly_id(user_id, period)


# --- 1. send-now when the monthly email never went out ---------------------------------------


@pytest.mark.both_brokers
@ON_POSTGRESQL
@pytest.mark.parametrize("before", ["never triggered", "planned, bulk not running"])
def test_send_now_for_a_user_never_mailed_is_the_monthly_email_and_the_monthly_run_sends_no_second(
    settings, sessions, smtp_server, start_workers, before
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=8, inactive_every=1000)
    user = 3
    groups = []
    if before == "planned, bulk not running":
        cli_ok(settings, "trigger", PERIOD)
        groups.append(start_workers(settings, processes=1, threads=2, queues=(DEFAULT_QUEUE,)))
        wait_for_progress(settings, PERIOD, until="planned", timeout=30)
        assert waiting(settings, BULK_QUEUE) == len(population.active)
        assert item_state(sessions, user) == "pending"

    untriggered = ("--allow-untriggered",) if before == "never triggered" else ()
    result = run_cli(settings, "send-now", str(user), PERIOD, *untriggered)
    assert result.returncode == 0, result.stderr
    request_id = request_id_in(result.stdout)
    assert waiting(settings, CRITICAL_QUEUE) == 1

    groups.append(start_workers(settings, processes=1, threads=4, queues=(CRITICAL_QUEUE,)))
    wait_until(lambda: smtp_server.by_user().get(user), timeout=30, what="the send-now email")
    wait_until(lambda: queue_settled(settings, CRITICAL_QUEUE), timeout=30, what="the critical queue to settle")
    [message] = smtp_server.messages
    assert message["Message-ID"].strip() == monthly_id(user), "the first email of a period must be the monthly one"
    assert request_id not in message["Message-ID"]
    assert message["X-Report-Period"] == PERIOD and message["X-Report-User-Id"] == str(user)
    if before == "planned, bulk not running":
        assert item_state(sessions, user) == "delivered"
        assert progress_json(settings)["delivered"] == 1
        # Nobody else was mailed: the bulk messages are still waiting.
        assert waiting(settings, BULK_QUEUE) == len(population.active)

    # Later the monthly run proceeds: user 3 is not mailed again, and its item ends delivered.
    groups.append(start_workers(settings, processes=1, threads=4, queues=(DEFAULT_QUEUE, BULK_QUEUE)))
    trigger = run_cli(settings, "trigger", PERIOD)
    assert trigger.returncode == 0, trigger.stderr
    final = wait_for_progress(settings, PERIOD)
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
    assert item_state(sessions, user) == "delivered"
    stop_all(*groups)
    assert_each_mailed_once(smtp_server, population.active)


# --- 2. send-now after the monthly email: a new email per request ----------------------------


@pytest.mark.both_brokers
def test_send_now_after_the_monthly_email_sends_one_new_email_per_request_even_if_delivered_twice(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=5, inactive_every=1000)
    user = 2
    workers = start_workers(settings, processes=1, threads=4)  # every queue
    cli_ok(settings, "trigger", PERIOD)
    wait_for_progress(settings, PERIOD)
    assert_each_mailed_once(smtp_server, population.active)

    # An operator asks for user 2's report again: a new email with a Message-ID of its own.
    printed = cli_ok(settings, "send-now", str(user), PERIOD)
    first_request = request_id_in(printed)
    # It says where the email goes, and how to read the request's state, which ends `sent`.
    assert f"the SMTP server 127.0.0.1:{smtp_server.port} (SMTP_URL)" in printed, printed
    [state_query] = [line.partition(": ")[2] for line in printed.splitlines() if line.startswith("To see its state")]
    wait_until(lambda: messages_with(smtp_server, first_request), timeout=30, what="the first send-now email")
    with sessions() as session:
        wait_until(
            lambda: session.execute(text(state_query.rstrip(";"))).one().state == "sent",
            timeout=10,
            what="the printed query to read the request as sent",
        )
    [sent_now] = messages_with(smtp_server, first_request)
    assert sent_now["Message-ID"].strip() == f"<report.{PERIOD}.{user}.{first_request}@{DOMAIN}>"
    assert sent_now["X-Report-User-Id"] == str(user) and sent_now["X-Report-Period"] == PERIOD

    # The same request delivered twice (two copies of one payload at once) is still one email.
    broker = build_broker(settings)
    twice = SendNowJob(Period.parse(PERIOD), user, str(uuid.uuid4()), settings.template_version)
    send(broker, SEND_NOW, twice.payload())
    send(broker, SEND_NOW, twice.payload())
    wait_until(lambda: messages_with(smtp_server, twice.request_id), timeout=30, what="the duplicated request")
    # The copy that lost the race waits out the claim's lease (5 s here) and then finds it sent.
    wait_until(lambda: queue_settled(settings, CRITICAL_QUEUE), timeout=30, what="both copies to finish")
    time.sleep(0.5)
    assert len(messages_with(smtp_server, twice.request_id)) == 1
    broker.close()

    # Another request sends one more.
    second_request = request_id_in(cli_ok(settings, "send-now", str(user), PERIOD))
    assert second_request not in (first_request, twice.request_id)
    wait_until(lambda: messages_with(smtp_server, second_request), timeout=30, what="the second send-now email")
    wait_until(lambda: queue_settled(settings, CRITICAL_QUEUE), timeout=30, what="the critical queue to settle")
    stop_all(workers)

    mine = smtp_server.by_user()[user]
    ids = [m["Message-ID"].strip() for m in mine]
    assert len(ids) == 4 and len(set(ids)) == 4, ids
    assert ids[0] == monthly_id(user)
    others = {u: len(ms) for u, ms in smtp_server.by_user().items() if u != user}
    assert others == {u: 1 for u in population.active if u != user}
    # Send-now emails change nothing in the monthly count.
    assert progress_json(settings)["delivered"] == len(population.active)


# --- 3. bad input ----------------------------------------------------------------------------


@ON_SQLITE
def test_admin_commands_reject_bad_input_with_exit_2_one_line_and_nothing_enqueued(settings, sessions):
    load_users(sessions, count=3, inactive_every=1000)
    cases = [
        ("send-now", "9999", PERIOD),  # no such user
        ("send-now", "0", PERIOD),
        ("send-now", "abc", PERIOD),
        ("send-now", "-4", PERIOD),
        ("send-now", "1", "2026-1"),
        ("send-now", "1", "2026/10"),
        ("send-now", "1", "2026-13"),
        ("send-now", "1", CURRENT_MONTH),
        ("send-now", "1", NEXT_MONTH),
        ("send-now", "1"),
        ("send-now", "1", "1999-01"),  # never triggered
        ("cancel", PERIOD),  # never triggered
        ("cancel", "2026/10"),
        ("cancel", "October"),
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda args: run_cli(settings, *args), cases))

    failures = []
    for args, result in zip(cases, results, strict=True):
        lines = result.stderr.splitlines()
        if result.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error:") or result.stdout:
            failures.append(
                f"reports {' '.join(args)}: exit {result.returncode}, stdout {result.stdout!r}, "
                f"stderr {result.stderr!r}"
            )
    assert failures == [], "\n".join(failures)

    by_args = dict(zip(cases, results, strict=True))
    assert "9999" in by_args[("send-now", "9999", PERIOD)].stderr
    assert PERIOD in by_args[("cancel", PERIOD)].stderr
    assert CURRENT_MONTH in by_args[("send-now", "1", CURRENT_MONTH)].stderr
    assert "--allow-untriggered" in by_args[("send-now", "1", "1999-01")].stderr

    for queue in (CRITICAL_QUEUE, DEFAULT_QUEUE, BULK_QUEUE):
        assert queued_messages(settings.broker_url, settings.broker_namespace, queue) == 0, queue
    assert count_rows(sessions, "period_runs") == 0
    assert count_rows(sessions, "resends") == 0


#: What an operator passes to send-now to a deactivated user of a month that was never run.
BOTH_ALLOWED = ("--include-inactive", "--allow-untriggered")


@pytest.mark.parametrize("left_out", BOTH_ALLOWED)
def test_send_now_to_a_deactivated_user_or_of_a_month_never_run_is_refused_unless_the_operator_asks(
    settings, sessions, left_out
):
    population = load_users(sessions, count=5, inactive_every=5)
    [inactive] = population.inactive

    refused = run_cli(settings, "send-now", str(inactive), PERIOD, *(o for o in BOTH_ALLOWED if o != left_out))
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and left_out in refused.stderr
    assert queued_messages(settings.broker_url, settings.broker_namespace, CRITICAL_QUEUE) == 0
    assert count_rows(sessions, "resends") == 0

    asked = run_cli(settings, "send-now", str(inactive), PERIOD, *BOTH_ALLOWED)
    assert asked.returncode == 0, asked.stderr
    assert queued_messages(settings.broker_url, settings.broker_namespace, CRITICAL_QUEUE) == 1
    assert count_rows(sessions, "resends") == 1, "the request is recorded when it is made"


def test_send_now_whose_message_the_broker_refuses_says_the_request_is_recorded_for_reconcile(settings, sessions):
    population = load_users(sessions, count=3)
    # RabbitMQ is down (Redis keeps the shared state): the request is recorded, then its enqueue fails.
    down = replace(
        settings, broker_url=f"amqp://guest:guest@127.0.0.1:{free_port()}/", redis_url=settings.shared_redis_url
    )

    failed = run_cli(down, "send-now", str(population.active[0]), PERIOD, "--allow-untriggered")

    assert failed.returncode == 1, failed.stderr
    [line] = failed.stderr.splitlines()
    assert "is recorded" in line and f"reports reconcile {PERIOD}" in line and "do not request it again" in line
    assert count_rows(sessions, "resends") == 1


# --- 4. cancel and resume --------------------------------------------------------------------


@pytest.mark.both_brokers
@ON_POSTGRESQL
def test_cancel_stops_new_sends_and_trigger_resumes_without_mailing_anyone_twice(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=60, inactive_every=5)
    # About ten sends a second: slow enough to cancel mid-run.
    smtp_server.handler.delay_seconds = 0.1
    workers = start_workers(settings, processes=1, threads=1, queues=(DEFAULT_QUEUE, BULK_QUEUE))
    cli_ok(settings, "trigger", PERIOD)
    wait_until(lambda: len(smtp_server.messages) >= 3, timeout=30, what="the first deliveries")

    cancelled = run_cli(settings, "cancel", PERIOD)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout
    time.sleep(1.5)  # what was in flight finishes
    stopped_at = len(smtp_server.messages)
    time.sleep(3)
    assert len(smtp_server.messages) == stopped_at, "emails were still sent after the period was cancelled"
    assert stopped_at < len(population.active), "the run finished before the cancel could stop it"

    [summary] = [p for p in periods_json(settings) if p["period"] == PERIOD]
    assert summary["state"] == "cancelled"
    assert summary["complete"] is False
    assert summary["delivered"] == stopped_at
    assert summary["pending"] > 0
    assert summary["delivered"] + summary["skipped"] + summary["dead"] + summary["pending"] == summary["total"]
    progress = progress_json(settings)
    assert progress["complete"] is False and progress["delivered"] == stopped_at

    again = run_cli(settings, "cancel", PERIOD)
    assert again.returncode == 0, again.stderr

    resumed = run_cli(settings, "trigger", PERIOD)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in resumed.stdout, resumed.stdout
    final = wait_for_progress(settings, PERIOD, timeout=90)
    assert (final["delivered"], final["pending"], final["total"]) == (len(population.active), 0, len(population.active))
    [summary] = [p for p in periods_json(settings) if p["period"] == PERIOD]
    assert summary["state"] == "active" and summary["complete"] is True
    stop_all(workers)
    assert_each_mailed_once(smtp_server, population.active)


@ON_SQLITE
def test_a_cancelled_period_says_so_and_watching_it_stops_at_once(settings, sessions):
    load_users(sessions, count=5)
    cli_ok(settings, "trigger", PERIOD)
    cli_ok(settings, "cancel", PERIOD)

    reading = progress_json(settings)
    assert (reading["state"], reading["complete"]) == ("cancelled", False)
    human = cli_ok(settings, "progress", PERIOD)
    assert f"cancelled: `reports trigger {PERIOD}` resumes it" in human, human
    # Waiting for a month that sends nothing until it is resumed would be for ever.
    watched = run_cli(settings, "progress", PERIOD, "--watch", "--json", timeout=20)
    assert watched.returncode == 1, watched.stderr
    [line] = watched.stderr.strip().splitlines()
    assert line.startswith("error:") and "cancelled" in line and f"reports trigger {PERIOD}" in line
    assert json.loads(watched.stdout)["state"] == "cancelled"
    reconciled = json.loads(cli_ok(settings, "reconcile", PERIOD, "--json"))
    assert (reconciled["cancelled"], reconciled["requeued"], reconciled["coordinator_enqueued"]) == (True, 0, False)
    assert "cancelled: its items wait" in cli_ok(settings, "reconcile", PERIOD)

    assert "resumed" in cli_ok(settings, "trigger", PERIOD)
    assert progress_json(settings)["state"] == "active"
    assert json.loads(cli_ok(settings, "reconcile", PERIOD, "--json"))["cancelled"] is False


# --- 5. the periods overview -----------------------------------------------------------------


@ON_POSTGRESQL
def test_periods_lists_every_triggered_period_newest_first_with_state_and_counts(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=10, inactive_every=5)
    assert periods_json(settings) == []

    # Both triggered by the command; only 2026-09 is planned (here, in-process) and delivered by a
    # bulk pool. With no default pool, 2026-10's coordinator never runs.
    cli_ok(settings, "trigger", "2026-09")
    cli_ok(settings, "trigger", "2026-10")
    broker = build_broker(settings)
    planned = coordinator.walk_slice(
        sessions,
        Period(2026, 9),
        queue_for(broker),
        page_size=7,
        budget_seconds=60,
    )
    assert planned.planned
    broker.close()
    workers = start_workers(settings, processes=1, threads=4, queues=(BULK_QUEUE,))
    wait_for_progress(settings, "2026-09")
    stop_all(workers)

    listed = periods_json(settings)
    assert [p["period"] for p in listed] == ["2026-10", "2026-09"]
    for entry in listed:
        assert set(entry) >= PERIODS_KEYS, entry
        triggered_at = datetime.fromisoformat(entry["triggered_at"])
        assert abs((datetime.now(UTC) - triggered_at).total_seconds()) < 300
    october, september = listed
    active = len(population.active)
    assert {k: september[k] for k in PERIODS_KEYS - {"triggered_at"}} == {
        "period": "2026-09",
        "state": "active",
        "planned": True,
        "total": active,
        "delivered": active,
        "skipped": 0,
        "dead": 0,
        "pending": 0,
        "complete": True,
    }
    assert {k: october[k] for k in PERIODS_KEYS - {"triggered_at"}} == {
        "period": "2026-10",
        "state": "active",
        "planned": False,
        "total": 0,
        "delivered": 0,
        "skipped": 0,
        "dead": 0,
        "pending": 0,
        "complete": False,
    }

    # Read as an operator's script or a log would: stdout is not a terminal.
    human = run_cli(settings, "periods")
    assert human.returncode == 0, human.stderr
    assert "2026-10" in human.stdout and "2026-09" in human.stdout, f"periods not shown:\n{human.stdout}"
    assert human.stdout.index("2026-10") < human.stdout.index("2026-09")
    # A person reads "complete" for the finished month (the JSON above keeps the run's state).
    assert "2026-09  complete " in human.stdout and "2026-10  active " in human.stdout, human.stdout


@ON_SQLITE
def test_periods_shows_whole_periods_and_column_names_on_an_80_column_terminal(settings, sessions):
    cli_ok(settings, "trigger", "2026-09")
    cli_ok(settings, "trigger", "2026-10")
    cli_ok(settings, "cancel", "2026-09")
    code, screen = run_in_terminal(settings, "periods", columns=80)
    assert code == 0, screen
    for word in ("2026-10", "2026-09", "active", "cancelled", "planned", "delivered", "skipped", "pending", "complete"):
        assert word in screen, f"{word!r} is cut off on an 80-column terminal:\n{screen}"


# --- 6. a critical message overtakes a 50,000-message bulk backlog ---------------------------

BACKLOG = 50_000
LATENCY_USERS = 50


@pytest.mark.both_brokers
@ON_POSTGRESQL
@pytest.mark.serial
def test_a_critical_message_is_processed_within_a_second_behind_a_50000_message_bulk_backlog(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, plan_page_size=LATENCY_USERS)
    population = load_users(sessions, count=LATENCY_USERS, inactive_every=10**6)
    assert len(population.active) == LATENCY_USERS
    broker = build_broker(settings)
    period = Period.parse(PERIOD)
    with sessions.begin() as session:
        runs.trigger(session, period, template_version=settings.template_version, now=utcnow())

    # Valid messages only: every copy names a real item, so the consumer absorbs the repeats.
    copies = BACKLOG // LATENCY_USERS

    port = queue_for(broker)  # the broker's own queue, Redis or RabbitMQ

    class Flooding:
        def send_jobs(self, spec, payloads) -> int:  # type: ignore[no-untyped-def]
            batch = list(payloads)
            return port.send_jobs(spec, (p for _ in range(copies) for p in batch))

        def __getattr__(self, name: str) -> Any:
            return getattr(port, name)

    outcome = coordinator.walk_slice(sessions, period, Flooding(), page_size=LATENCY_USERS, budget_seconds=120)
    assert outcome.planned and outcome.enqueued == BACKLOG

    def backlog() -> int:
        return waiting(settings, BULK_QUEUE)

    assert backlog() == BACKLOG
    critical = start_workers(settings, processes=1, threads=4, queues=(CRITICAL_QUEUE,))
    bulk = start_workers(settings, processes=1, threads=4, queues=(BULK_QUEUE,))
    user = 1
    wait_until(lambda: smtp_server.by_user().get(user), timeout=30, what="the bulk pool to mail user 1")

    latencies, backlogs = [], []
    for _ in range(3):
        time.sleep(1.2)  # the critical pool is idle, as it is when a request comes in
        job = SendNowJob(period, user, str(uuid.uuid4()), settings.template_version)
        started = time.monotonic()
        send(broker, SEND_NOW, job.payload())
        deadline = started + 10
        while not messages_with(smtp_server, job.request_id) and time.monotonic() < deadline:
            time.sleep(0.002)
        latencies.append(time.monotonic() - started)
        backlogs.append(backlog())
    broker.close()
    stop_all(critical, bulk)

    assert all(latency < 10 for latency in latencies), f"a send-now never arrived: {latencies}"
    assert statistics.median(latencies) < 1.0, f"send-now latencies behind the bulk backlog: {latencies}"
    # The bulk pool absorbs the repeats at a few thousand a second, faster on a quiet machine: what
    # matters is that every send-now had tens of thousands of bulk messages ahead of it.
    assert min(backlogs) > BACKLOG // 5, f"the bulk backlog drained too far to show anything: {backlogs}"
