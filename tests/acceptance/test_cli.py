"""The ``reports`` command as an operator runs it: exit codes, one-line errors, and no side effects on rejection.

Every command exits 0 on success and 2 on bad input with one clear line on stderr, and changes
nothing when it rejects its input (CONTRACT.md, "Command line").
"""

from __future__ import annotations

import inspect as pyinspect
import json
import os
import socket
import subprocess
import sys
from dataclasses import replace

import click
import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.orm import Session, sessionmaker

from reports.cli import cli
from reports.database import create_db_engine
from reports.jobs import MAX_USER_ID, CoordinatorJob
from reports.periods import Period
from reports.settings import Settings
from tests.support.broker import jobs_in_queue, messages_in_queue, queue_counts
from tests.support.databases import load_users
from tests.support.environment import REPO
from tests.support.periods import month_from_now
from tests.support.processes import run_cli, wait_for_progress

pytestmark = pytest.mark.acceptance

SECRET = "s3cretpw"
PROGRESS_KEYS = {"period", "total", "planned", "delivered", "skipped", "dead", "pending", "state", "complete"}


CURRENT_MONTH = month_from_now(0)
NEXT_MONTH = month_from_now(1)
NEXT_YEAR = month_from_now(12)
LAST_MONTH = month_from_now(-1)

MALFORMED_PERIODS = ("2026-1", "2026/10", "October", "", "2026-13", "2026-00")
UNENDED_PERIODS = (CURRENT_MONTH, NEXT_MONTH, NEXT_YEAR)


# --- helpers ---------------------------------------------------------------------------------


def assert_one_error_line(result: subprocess.CompletedProcess[str], *, code: int | None = 2) -> str:
    """The command failed with ``code`` (any non-zero code if ``None``) and one ``error:`` line on stderr."""
    described = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    if code is None:
        assert result.returncode != 0, described
    else:
        assert result.returncode == code, described
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr\n{described}"
    assert lines[0].strip(), described
    assert lines[0].startswith("error:"), described
    return lines[0]


def assert_rejected(result: subprocess.CompletedProcess[str]) -> str:
    """Bad input: exit 2, one ``error:`` line on stderr, nothing on stdout."""
    line = assert_one_error_line(result, code=2)
    assert result.stdout == "", f"stdout should be empty on rejection, got {result.stdout!r}"
    return line


def count_rows(sessions: sessionmaker[Session], table: str) -> int:
    with sessions() as session:
        return session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def assert_nothing_changed(settings: Settings, sessions: sessionmaker[Session]) -> None:
    assert count_rows(sessions, "period_runs") == 0
    assert count_rows(sessions, "report_items") == 0
    assert queue_counts(settings) == {"default": 0, "bulk": 0}


# --- trigger: rejected periods ---------------------------------------------------------------


def test_trigger_rejects_a_malformed_period_and_changes_nothing(settings, sessions):
    for period in MALFORMED_PERIODS:
        result = run_cli(settings, "trigger", period)
        line = assert_rejected(result)
        assert "period" in line.lower(), line
        assert_nothing_changed(settings, sessions)


def test_trigger_rejects_the_current_and_future_months_and_changes_nothing(settings, sessions):
    for period in UNENDED_PERIODS:
        result = run_cli(settings, "trigger", period)
        line = assert_rejected(result)
        assert period in line, line
        assert_nothing_changed(settings, sessions)


def test_trigger_without_a_period_is_a_usage_error(settings, sessions):
    assert_rejected(run_cli(settings, "trigger"))
    assert_nothing_changed(settings, sessions)


def test_trigger_with_an_unknown_option_is_a_usage_error(settings, sessions):
    line = assert_rejected(run_cli(settings, "trigger", "--frobnicate", LAST_MONTH))
    assert "--frobnicate" in line
    assert_nothing_changed(settings, sessions)


# --- progress: rejected periods --------------------------------------------------------------


def test_progress_of_a_never_triggered_period_is_bad_input(settings, sessions):
    line = assert_rejected(run_cli(settings, "progress", LAST_MONTH))
    assert LAST_MONTH in line
    assert_rejected(run_cli(settings, "progress", LAST_MONTH, "--json"))
    assert_nothing_changed(settings, sessions)


def test_progress_of_a_malformed_period_is_bad_input(settings, sessions):
    for period in ("2026-1", "October", "2026-13"):
        assert_rejected(run_cli(settings, "progress", period, "--json"))
    assert_nothing_changed(settings, sessions)


# --- seed: rejected counts -------------------------------------------------------------------


@pytest.mark.parametrize("users", ["0", "abc"])
def test_seed_rejects_a_bad_user_count_and_inserts_nothing(settings, sessions, users):
    line = assert_rejected(run_cli(settings, "seed", "--users", users))
    assert "--users" in line
    assert count_rows(sessions, "users") == 0
    assert count_rows(sessions, "activities") == 0


# --- trigger: idempotent ---------------------------------------------------------------------


def test_triggering_twice_keeps_one_run_and_the_output_matches_what_is_queued(settings, sessions):
    first = run_cli(settings, "trigger", LAST_MONTH)
    assert first.returncode == 0, first.stderr
    assert f"Triggered {LAST_MONTH}" in first.stdout
    assert "coordinator enqueued" in first.stdout
    assert count_rows(sessions, "period_runs") == 1
    assert queue_counts(settings) == {"default": 1, "bulk": 0}
    [coordinator] = messages_in_queue(settings, "default")
    assert coordinator["actor_name"] == "plan_period"
    assert jobs_in_queue(settings, "default", CoordinatorJob) == [CoordinatorJob(Period.parse(LAST_MONTH))]

    second = run_cli(settings, "trigger", LAST_MONTH)
    assert second.returncode == 0, second.stderr
    assert count_rows(sessions, "period_runs") == 1
    # No worker has run, so the period is not planned yet: the re-trigger resumes the coordinator
    # (which is idempotent). What the command says must be what is in Redis.
    assert "already triggered" in second.stdout, second.stdout
    says_enqueued = "coordinator enqueued" in second.stdout and "nothing enqueued" not in second.stdout
    assert says_enqueued, second.stdout
    assert queue_counts(settings) == {"default": 2, "bulk": 0}
    assert jobs_in_queue(settings, "default", CoordinatorJob) == [CoordinatorJob(Period.parse(LAST_MONTH))] * 2


# --- progress after a full run ---------------------------------------------------------------


def test_progress_reports_a_completed_period_as_json_as_text_and_while_watching(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url)
    population = load_users(sessions, count=20, period=LAST_MONTH, inactive_every=5)
    start_workers(settings, processes=1, threads=4)
    triggered = run_cli(settings, "trigger", LAST_MONTH)
    assert triggered.returncode == 0, triggered.stderr

    final = wait_for_progress(settings, LAST_MONTH)
    assert set(final) == PROGRESS_KEYS
    assert final["period"] == LAST_MONTH
    assert final["delivered"] + final["skipped"] + final["dead"] + final["pending"] == final["total"]
    assert final["complete"] is True and final["planned"] is True
    assert final["total"] == final["delivered"] == len(population.active)
    assert (final["skipped"], final["dead"], final["pending"]) == (0, 0, 0)

    human = run_cli(settings, "progress", LAST_MONTH)
    assert human.returncode == 0, human.stderr
    total = len(population.active)
    for fragment in (
        LAST_MONTH,
        f"{total}/{total}",
        f"delivered {total}",
        "skipped 0",
        "dead 0",
        "pending 0",
        "complete=true",
    ):
        assert fragment in human.stdout, (fragment, human.stdout)

    watched = run_cli(settings, "progress", LAST_MONTH, "--watch", "--json", timeout=30)
    assert watched.returncode == 0, watched.stderr
    assert json.loads(watched.stdout) == final


# --- db upgrade ------------------------------------------------------------------------------


def test_db_upgrade_runs_twice_on_a_fresh_database(settings):
    for attempt in (1, 2):
        result = run_cli(settings, "db", "upgrade")
        assert result.returncode == 0, f"attempt {attempt}: {result.stderr}"
    engine = create_db_engine(settings.database_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert {"users", "activities", "period_runs", "report_items"} <= tables
        with engine.connect() as connection:
            assert connection.execute(select(func.count()).select_from(text("alembic_version"))).scalar_one() == 1
    finally:
        engine.dispose()


# --- secrets never printed -------------------------------------------------------------------


def test_an_unreachable_database_fails_in_one_line_without_its_password(settings):
    settings = replace(settings, database_url=f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:1/x")
    result = run_cli(settings, "trigger", LAST_MONTH)
    assert_one_error_line(result, code=None)
    assert SECRET not in result.stdout
    assert SECRET not in result.stderr


@pytest.mark.parametrize(
    ("broker_url", "error"),
    [
        (f"redis://:{SECRET}@127.0.0.1:1/0", "ConnectionError"),
        (f"amqp://guest:{SECRET}@127.0.0.1:1/", "ConnectionClosed"),
        ("sqs://us-east-1?endpoint_url=http://127.0.0.1:1", None),
    ],
    ids=["redis", "rabbitmq", "sqs"],
)
def test_an_unreachable_broker_fails_in_one_line_without_its_password(settings, sessions, broker_url, error):
    shared = {} if broker_url.startswith("redis") else {"redis_url": settings.shared_redis_url}
    settings = replace(settings, broker_url=broker_url, **shared)
    result = run_cli(settings, "trigger", LAST_MONTH)
    # Exit 1 like an unreachable database: the command line itself was fine.
    line = assert_one_error_line(result, code=1)
    assert line.startswith(f"error: Broker error ({error or ''}") and "reachable?" in line, line
    assert SECRET not in result.stdout
    assert SECRET not in result.stderr


def test_a_sqlite_file_that_is_no_database_fails_in_one_line(settings, tmp_path):
    script = tmp_path / "not-a-database.sh"
    script.write_text("#!/bin/sh\necho this is no database, but a shell script of some length\n" * 20)
    result = run_cli_with(settings, {"DATABASE_URL": f"sqlite:///{script}"}, "progress", LAST_MONTH)
    assert assert_one_error_line(result, code=1) == (
        "error: Database error (DatabaseError); is it reachable and migrated (`reports db upgrade`)?"
    )


# --- bad input to every command: one line, exit 2, nothing changed ---------------------------

TABLES = ("users", "activities", "period_runs", "report_items", "dead_letters")
HUGE_IDS = (str(2**31), str(2**63))


def snapshot(settings: Settings, sessions: sessionmaker[Session]) -> dict[str, int]:
    """Rows in every table a command could change, and the messages waiting in the queues."""
    return {**{table: count_rows(sessions, table) for table in TABLES}, **queue_counts(settings)}


@pytest.mark.parametrize("interval", ["nan", "inf", "-inf", "1e9"])
def test_progress_watch_rejects_an_interval_that_is_not_a_finite_number_of_seconds(settings, sessions, interval):
    assert run_cli(settings, "trigger", LAST_MONTH).returncode == 0
    before = snapshot(settings, sessions)
    line = assert_rejected(run_cli(settings, "progress", LAST_MONTH, "--watch", "--interval", interval, timeout=20))
    assert "--interval" in line, line
    assert snapshot(settings, sessions) == before


@pytest.mark.parametrize("huge", HUGE_IDS)
@pytest.mark.parametrize("command", [("dlq", "show"), ("dlq", "replay", "--id"), ("dlq", "list", "--limit")])
def test_dlq_rejects_an_id_or_limit_past_the_integer_range(settings, sessions, command, huge):
    before = snapshot(settings, sessions)
    assert_rejected(run_cli(settings, *command, huge))
    assert snapshot(settings, sessions) == before


@pytest.mark.parametrize("reason", [b"\xff\xfe550", "5" * 100_000], ids=["invalid-utf8", "100000-characters"])
def test_dlq_list_rejects_a_reason_that_is_not_utf8_or_is_absurdly_long(settings, sessions, reason):
    before = snapshot(settings, sessions)
    line = assert_rejected(run_cli(settings, "dlq", "list", "--reason", reason))
    assert "--reason" in line and len(line) < 300, line[:300]
    assert snapshot(settings, sessions) == before


def test_dlq_purge_rejects_an_age_whose_date_overflows(settings, sessions):
    before = snapshot(settings, sessions)
    line = assert_rejected(run_cli(settings, "dlq", "purge", "--older-than", "1000000"))
    assert "--older-than" in line, line
    assert snapshot(settings, sessions) == before


def test_seed_rejects_users_past_the_32_bit_id_range_and_inserts_nothing(settings, sessions):
    with sessions.begin() as session:
        session.execute(
            text("INSERT INTO users (id, email, name, active) VALUES (:id, 'last@example.test', 'L', true)"),
            {"id": MAX_USER_ID - 2},
        )
    before = snapshot(settings, sessions)
    line = assert_rejected(run_cli(settings, "seed", "--users", "5"))
    assert f"{MAX_USER_ID:,}" in line, line
    assert_rejected(run_cli(settings, "seed", "--users", str(2**31)))
    assert snapshot(settings, sessions) == before


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (("preview", LAST_MONTH, "--out", ""), "--out"),  # would write into the current folder
        (("web", "--host", "", "--port", "18765"), "--host"),  # would listen on every address
        (("seed", "--users", "1", "--period", ""), "period"),  # would seed last month
    ],
    ids=["preview-out", "web-host", "seed-period"],
)
def test_an_empty_value_is_refused_where_it_would_mean_something_else(settings, sessions, command, named):
    before = snapshot(settings, sessions)
    line = assert_rejected(run_cli(settings, *command))
    assert named in line, line
    assert snapshot(settings, sessions) == before


def test_the_exporter_rejects_an_unknown_host_and_a_port_in_use_in_one_line(settings):
    line = assert_rejected(run_cli(settings, "exporter", "--host", "no-such-host.invalid", "--port", "9399"))
    assert "no-such-host.invalid" in line, line
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        line = assert_rejected(run_cli(settings, "exporter", "--host", "127.0.0.1", "--port", str(port)))
    assert str(port) in line, line


@pytest.mark.parametrize(
    "command",
    [("progress", LAST_MONTH), ("progress", LAST_MONTH, "--json"), ("periods",), ("dlq", "list"), ("dlq", "show", "1")],
)
def test_a_read_only_command_on_a_mistyped_sqlite_path_creates_no_database(
    tmp_path, broker_namespace, redis_url, command
):
    typo = tmp_path / "vra" / "reports.db"
    settings = Settings(
        var_dir=tmp_path / "var",
        database_url=f"sqlite:///{typo}",
        broker_url=redis_url,
        broker_namespace=broker_namespace,
    )
    # Exit 1 like an unreachable database: the command line itself was fine.
    line = assert_one_error_line(run_cli(settings, *command), code=1)
    assert str(typo) in line, line
    assert not typo.parent.exists(), list(tmp_path.rglob("*"))


@pytest.mark.parametrize(
    "command", [("trigger", LAST_MONTH), ("seed", "--users", "5"), ("send-now", "1", LAST_MONTH), ("periods",)]
)
def test_a_command_run_from_another_folder_says_where_it_looked_and_creates_nothing(tmp_path, command):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {name: value for name, value in os.environ.items() if name not in ("DATABASE_URL", "VAR_DIR")}
    result = subprocess.run(
        [sys.executable, "-m", "reports", *command],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = assert_one_error_line(result, code=1)
    # The whole path, so the operator sees which folder the default ./var was read from.
    assert f"No database at {elsewhere / 'var' / 'reports.db'}" in line, line
    assert "VAR_DIR" in line and "DATABASE_URL" in line, line
    assert list(elsewhere.iterdir()) == [], "the command created files"


def test_bare_reports_prints_its_usage_and_h_is_help(tmp_path):
    for args, usage in (
        ((), "reports [OPTIONS] COMMAND"),
        (("-h",), "reports [OPTIONS] COMMAND"),
        (("--help",), "reports [OPTIONS] COMMAND"),
        (("dlq",), "reports dlq [OPTIONS] COMMAND"),
        (("dlq", "-h"), "reports dlq [OPTIONS] COMMAND"),
        (("trigger", "-h"), "reports trigger"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "reports", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (result.returncode, result.stderr) == (0, ""), (args, result)
        assert result.stdout.startswith(f"Usage: {usage}"), (args, result.stdout)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("group", ["", "dlq", "suppress", "db"])
def test_h_lists_every_command_with_its_whole_summary_on_an_80_column_terminal(tmp_path, group):
    result = subprocess.run(
        [sys.executable, "-m", "reports", *group.split(), "-h"],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result
    listing = result.stdout.partition("Commands:")[2]
    words = " ".join(listing.split())
    listed = cli.get_command(click.Context(cli), group) if group else cli
    assert isinstance(listed, click.Group)
    context = click.Context(listed)
    commands = {name: listed.get_command(context, name) for name in listed.list_commands(context)}
    assert commands
    for name, command in commands.items():
        # The first paragraph of each command's help, whole: nothing cut short with "...".
        first = " ".join(pyinspect.cleandoc(command.help or "").split("\n\n", 1)[0].split())
        assert f"{name} {first}" in words, (name, result.stdout)
    assert "..." not in listing, result.stdout


def run_cli_with(settings: Settings, environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``reports`` with ``environ`` over the test's settings: for values Settings itself refuses."""
    return subprocess.run(
        [sys.executable, "-m", "reports", *args],
        env={**os.environ, **settings.as_environ(), **environ},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:notaport/reports",
        f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:99999/reports",
        f"postgresql+psycopg://postgres@127.0.0.1:notaport/reports?sslmode=disable&password={SECRET}",
        "://x",
        # A driver that is not installed.
        f"postgresql+psycopg2://postgres:{SECRET}@127.0.0.1:1/reports",
        f"mysql://root:{SECRET}@127.0.0.1:1/reports",
        # Two slashes: "var" read as a host.
        "sqlite://var/reports.db",
    ],
)
def test_a_malformed_database_url_is_rejected_in_one_line_without_its_password(settings, url):
    result = run_cli_with(settings, {"DATABASE_URL": url}, "progress", LAST_MONTH)
    line = assert_rejected(result)
    assert "DATABASE_URL" in line
    assert SECRET not in result.stdout + result.stderr


def test_a_broker_url_whose_database_is_not_a_number_is_rejected_and_nothing_is_queued(settings, sessions):
    result = run_cli_with(settings, {"BROKER_URL": f"redis://:{SECRET}@127.0.0.1:6379/notadb"}, "trigger", LAST_MONTH)
    line = assert_rejected(result)
    assert "BROKER_URL" in line
    assert SECRET not in result.stdout + result.stderr
    assert_nothing_changed(settings, sessions)


def test_a_password_that_is_not_utf8_is_refused_before_any_hash_is_printed():
    typed = subprocess.run(
        [sys.executable, "-m", "reports", "console", "hash-password"],
        input=b"averylongpassword1\naverylongpassword2\xff\n",
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (typed.returncode, typed.stdout) == (2, b"")
    assert typed.stderr.decode().splitlines() == ["error: The password on line 2 is not UTF-8 text."]
