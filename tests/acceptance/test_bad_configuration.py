"""Processes refuse bad configuration at start: one ``error:`` line naming the variable, exit 2.

A worker or scheduler that started with a negative retry budget or a zero lease would run, and
fail later in ways that look like something else; these check the refusal an operator sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reports.settings import Settings
from tests.support.environment import REPO

pytestmark = pytest.mark.acceptance

BAD_VALUES = [
    ("MAX_RETRIES", "-1"),
    ("CLAIM_LEASE_SECONDS", "0"),
    ("REPORT_TEMPLATE_VERSION", "../secrets"),
    # Redis refuses SET … PX 0: the alert thread would spin on the error and never alert.
    ("ALERT_WINDOW_SECONDS", "0"),
    # A window that forgets each failure as it counts it: a breaker that never opens.
    ("BREAKER_WINDOW_SECONDS", "0"),
    # Every email would fail: SMTP carries no such address without SMTPUTF8.
    ("MAIL_FROM", "Reports <rapport-mensuel-é@example.com>"),
    # Every email would fail the header check: List-Unsubscribe separates URLs with commas.
    ("PUBLIC_BASE_URL", "https://reports.example.com/a,b"),
    # A host Python's URL parser raises on (an unclosed IPv6 literal).
    ("SMTP_URL", "smtps://user:secret@[::1"),
    # Each would fail at every message instead: a worker would retry them all for hours.
    ("DATABASE_URL", "postgresql+psycopg2://user:secret@127.0.0.1/reports"),
    ("DATABASE_URL", "sqlite://var/reports.db"),
    # The scheduler's, refused by every process: the release phase stops the deploy.
    ("SCHEDULE_TIME", "25:00"),
    # A CPU list where the setting takes a mode: the workers would run unpinned, unnoticed.
    ("WORKER_CPU_AFFINITY", "0-1"),
]


def start(command: list[str], tmp_path: Path, variable: str, value: str) -> subprocess.CompletedProcess[str]:
    # Nothing is reached before the configuration is read: no database or broker is needed.
    settings = Settings(var_dir=tmp_path / "var", broker_url="redis://127.0.0.1:1/0")
    return subprocess.run(
        command,
        env={**os.environ, **settings.as_environ(), variable: value},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str], variable: str) -> None:
    described = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, described
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {variable} must"), described
    assert "Traceback" not in result.stderr, described


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES)
def test_dramatiq_actors_exits_at_start_with_one_line_naming_the_variable(tmp_path, variable, value):
    command = [sys.executable, "-m", "dramatiq", "actors", "--processes", "1", "--threads", "1"]
    assert_one_error_line(start(command, tmp_path, variable, value), variable)


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES)
def test_the_scheduler_exits_at_start_with_one_line_naming_the_variable(tmp_path, variable, value):
    result = start([sys.executable, "-m", "scheduler"], tmp_path, variable, value)
    assert_one_error_line(result, variable)
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES)
def test_a_reports_command_exits_at_start_with_one_line_naming_the_variable(tmp_path, variable, value):
    result = start([sys.executable, "-m", "reports", "trigger", "2026-10"], tmp_path, variable, value)
    assert_one_error_line(result, variable)
    assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "dramatiq", "actors", "--processes", "1", "--threads", "1"],
        [sys.executable, "-m", "scheduler"],
        [sys.executable, "-m", "reports", "web", "--port", "1"],
    ],
    ids=["workers", "scheduler", "web"],
)
def test_a_production_process_without_an_unsubscribe_secret_refuses_to_start(tmp_path, command):
    """Only links served from this machine (the demo, a laptop) may use the built-in secret."""
    result = start(command, tmp_path, "PUBLIC_BASE_URL", "https://reports.example.com")
    described = f"exit {result.returncode}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, described
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: UNSUBSCRIBE_SECRET is required"), described
