"""The tests' command server: a command forked from it prints, exits and changes what the same
command started as a new interpreter does, one after another on one server; commands run side by
side, and one past its time is killed; and what acts when an interpreter starts sends a command
to a new interpreter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.command_server import CommandServer, needs_new_interpreter
from tests.support.environment import REPO
from tests.support.processes import free_port, run_process
from tests.support.waiting import wait_until

COMMANDS: list[list[str | bytes]] = [
    ["--help"],
    ["progress", "2026-13"],
    ["progress", "2026-10", "--json"],
    ["suppress", "add", b"\xff", "--reason", "bounced"],
    ["suppress", "add", "2", "--reason", "complained"],
    ["suppress", "add", "2", "--reason", "bounced"],
    ["nosuchcommand"],
]


@pytest.fixture
def server():
    server = CommandServer(REPO)
    yield server
    server.close()


# Every test that runs a command on PostgreSQL runs it forked from the server too.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_each_forked_command_prints_exits_and_changes_what_a_new_interpreter_does(settings, sessions, server):
    environ = {**os.environ, **settings.as_environ()}
    run_process(settings, [sys.executable, "-m", "reports", "seed", "--users", "3"])

    forked = [server.run(args, environ=environ, cwd=REPO, timeout=60) for args in COMMANDS]
    # The same commands again, each in a new interpreter, on the database as the forked ones found it.
    run_process(settings, [sys.executable, "-m", "reports", "suppress", "remove", "2"])
    fresh = [run_process(settings, [sys.executable, "-m", "reports", *args]) for args in COMMANDS]

    assert [(r.returncode, r.stdout, r.stderr) for r in forked] == [(r.returncode, r.stdout, r.stderr) for r in fresh]
    assert [r.returncode for r in forked] == [0, 2, 2, 2, 0, 0, 2]
    assert forked[5].stdout == "User 2 was already suppressed (complained); nothing changed.\n"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_commands_run_side_by_side_and_each_is_killed_past_its_timeout(settings, sessions, server):
    environ = {**os.environ, **settings.as_environ()}
    ports = [free_port(), free_port()]

    def serve(port: int) -> None:
        server.run(["web", "--host", "127.0.0.1", "--port", str(port)], environ=environ, cwd=REPO, timeout=6)

    def listening(port: int) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [pool.submit(serve, port) for port in ports]
        wait_until(lambda: all(map(listening, ports)), timeout=6, what="both web processes to listen")
        for run in runs:
            with pytest.raises(subprocess.TimeoutExpired):
                run.result()

    wait_until(lambda: not any(map(listening, ports)), timeout=10, what="both web processes to be gone")
    assert server.run(["--help"], environ=environ, cwd=REPO, timeout=60).returncode == 0


@pytest.mark.parametrize(
    ("changed", "new_interpreter"),
    [
        ({"DATABASE_URL": "sqlite:///other.db", "BROKER_URL": "redis://127.0.0.1:6379/3"}, False),
        ({"LD_PRELOAD": "/usr/lib/libfaketime.so.1"}, True),
        ({"FAKETIME": "+60s"}, True),
        ({"PYTHONIOENCODING": "latin-1"}, True),
        ({"LANG": "C"}, True),
        ({"LC_ALL": "C.UTF-8"}, True),
        ({"TZ": "Asia/Tashkent"}, True),
    ],
)
def test_only_what_acts_when_an_interpreter_starts_needs_a_new_one(changed, new_interpreter):
    server_environ = {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8"}

    assert needs_new_interpreter({**server_environ, **changed}, server_environ) is new_interpreter


def test_a_variable_the_server_has_and_the_command_lacks_needs_a_new_interpreter():
    assert needs_new_interpreter({"PATH": "/usr/bin"}, {"PATH": "/usr/bin", "PYTHONPATH": "/work"})
