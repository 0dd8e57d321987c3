"""Processes and ports: a free loopback port, a private redis-server, worker groups, the CLI."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import libfaketime
import pytest
import redis

from reports.database import create_db_engine, session_factory
from reports.errors import BadInput
from reports.fanout.progress import count
from reports.periods import Period
from reports.settings import Settings
from tests.support.command_server import CommandServer, needs_new_interpreter
from tests.support.environment import NEW_INTERPRETER_PER_COMMAND, REPO
from tests.support.waiting import wait_until

#: Where the kernel starts handing out connections' own (source) ports.
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port :func:`free_port` hands out, above the services' usual ports.
LOWEST_TEST_PORT = 10_000


def free_port() -> int:
    """A TCP port on the loopback that nothing is bound to right now, below the kernel's range of
    source ports.

    Tests stop a server and start it again on the same port (a provider's outage, a Redis killed
    and restarted). A port from the kernel's range could meanwhile become any connection's source
    port on the machine, even that of a client retrying the stopped server (a connection to
    itself), and the restart would fail with "address already in use": it did, once.
    """
    first_ephemeral = int(EPHEMERAL_PORTS.read_text().split()[0])
    pick = random.SystemRandom()
    while True:
        port = pick.randrange(LOWEST_TEST_PORT, first_ephemeral)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@contextlib.contextmanager
def redis_server(folder: str | Path | None = None, *, port: int | None = None) -> Iterator[str]:
    """A throwaway redis-server (no persistence) on ``port`` or a free loopback port; yields its URL once
    it answers.

    It works in ``folder``, or in a temporary folder removed after.
    """
    if folder is None:
        with (
            tempfile.TemporaryDirectory(prefix="redis-server-") as temporary,
            redis_server(temporary, port=port) as url,
        ):
            yield url
        return
    port = port or free_port()
    server = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def clock_ahead(seconds: int) -> dict[str, str]:
    """The environment that starts a process whose wall clock runs ``seconds`` ahead of the machine's
    (libfaketime, preloaded).

    Only the wall clock: a machine whose clock is off still has a monotonic clock that measures
    time as it passes (a step of the wall clock never moves it), and so does the process started
    this way; ``DONT_FAKE_MONOTONIC`` is among the package's own additions.
    """
    _, preload = libfaketime.get_reload_information()
    return {**preload, "FAKETIME": f"{seconds:+d}s"}


class MovableClock:
    """A wall clock the test moves, for processes started with :meth:`env` (libfaketime, preloaded).

    It reads its offset from a file at every call (``FAKETIME_NO_CACHE``), so :meth:`set` moves
    every such process's clock at once, and it runs at the machine's rate from there. Monotonic
    clocks are left real, as with :func:`clock_ahead`.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set(datetime.now(UTC).replace(tzinfo=None))

    def set(self, moment: datetime) -> None:
        """Make the processes' clocks read ``moment`` (naive UTC) now."""
        offset = (moment - datetime.now(UTC).replace(tzinfo=None)).total_seconds()
        temporary = self.path.with_suffix(".new")
        temporary.write_text(f"{offset:+.3f}s\n")
        temporary.replace(self.path)

    def env(self) -> dict[str, str]:
        _, preload = libfaketime.get_reload_information()
        return {**preload, "FAKETIME_TIMESTAMP_FILE": str(self.path)}


@dataclass
class WorkerGroup:
    """One ``dramatiq actors`` master process and its worker children (one process group)."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def kill(self) -> None:
        kill_group(self.process)


def children(pid: int) -> list[int]:
    """The process's children, by pid."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def libraries(pid: int) -> set[str]:
    """The shared objects the process has mapped; none once it is gone."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except FileNotFoundError:
        return set()
    return {line.split()[-1] for line in maps.splitlines() if ".so" in line}


def wait_for_actor_imports(process: subprocess.Popen[bytes], processes: int, *, timeout: float = 30) -> list[int]:
    """The ``dramatiq`` master ``process``'s worker processes, once all ``processes`` of them import
    the actors. The master imports none of the actors: a library it has not mapped shows a worker
    importing them, past the start of Dramatiq's worker process (whose SIGTERM handler fails
    before its logging is set up) and before it has booted."""

    def importing() -> list[int] | None:
        if process.poll() is not None:
            pytest.fail(f"The workers exited ({process.returncode}) while they started.")
        workers = children(process.pid)
        inherited = libraries(process.pid)
        if len(workers) == processes and all(libraries(worker) - inherited for worker in workers):
            return workers
        return None

    return cast(
        list[int], wait_until(importing, timeout=timeout, interval=0.002, what="the workers to import the actors")
    )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process``'s whole process group (it leads one) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_cli(settings: Settings, *args: str | bytes, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the ``reports`` command as an operator would, in a process of its own.

    The process is forked from this pytest process's command server, which imported the command
    once (:mod:`tests.support.command_server`), unless it must start a new interpreter.
    An argument may be bytes, to pass what a shell would (including bytes that are not UTF-8).
    """
    environ = {**os.environ, **settings.as_environ()}
    server = command_server()
    if server is None or needs_new_interpreter(environ, server.environ):
        return run_process(settings, [sys.executable, "-m", "reports", *args], timeout=timeout)
    return server.run(args, environ=environ, cwd=REPO, timeout=timeout)


@functools.cache
def command_server() -> CommandServer | None:
    """This pytest process's command server, started on first use; None when every command is to
    start a new interpreter (``TEST_NEW_INTERPRETER_PER_COMMAND`` set)."""
    if NEW_INTERPRETER_PER_COMMAND:
        return None
    server = CommandServer(REPO)
    atexit.register(server.close)
    return server


def run_process(
    settings: Settings, command: list[str | bytes], *, timeout: float = 60, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` from the repository with ``settings`` (and ``environ`` over them) in its
    environment, until it exits; what it printed."""
    return subprocess.run(
        command,
        env={**os.environ, **settings.as_environ(), **(environ or {})},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for_progress(
    settings: Settings, period: str, *, until: str = "complete", timeout: float = 60
) -> dict[str, object]:
    """Wait until the period's progress says ``until`` (``complete``, ``planned``); then what
    ``reports progress PERIOD --json`` says, for the test to check.

    The wait reads the progress from the database: a poll by the command would start a process
    several times a second, each spending half a second of CPU starting, taken from the workers
    the test waits on.
    """
    engine = create_db_engine(settings.database_url)
    try:
        sessions = session_factory(engine)

        def reached() -> bool:
            with sessions() as session:
                try:
                    return bool(count(session, Period.parse(period)).as_dict()[until])
                except BadInput:  # not triggered yet
                    return False

        wait_until(reached, timeout=timeout, interval=0.2, what=f"period {period} to be {until}")
    finally:
        engine.dispose()
    result = run_cli(settings, "progress", period, "--json")
    assert result.returncode == 0, result.stderr
    return cast(dict[str, object], json.loads(result.stdout))
