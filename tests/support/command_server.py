"""The ``reports`` command in a process of its own, forked from an interpreter that imported it once.

An operator's command starts a new interpreter, which spends 0.5-0.8 s of CPU importing the CLI,
SQLAlchemy and the database drivers before it reads its arguments; the suite runs several hundred
commands, on two cores shared with the workers the tests wait on. So each pytest process keeps
one server (``python -m tests.support.command_server SOCKET``) that imports all of that once, and
forks a child for each command. The child takes the test's standard streams, environment, working
folder and arguments, then runs ``python -m reports`` as a new interpreter would
(:func:`runpy.run_module`), and exits through the interpreter's own exit: its exit code, its
output and the database it changes are the command's. Nothing a command does reaches the next one,
which forks from the server as it was before any command ran.

What acts when an interpreter starts (a preloaded library, Python's own variables, the locale, the
time zone) would act on the server, not on the child; a command run with any of those different
from the server's starts a new interpreter instead (:func:`needs_new_interpreter`), as does every
command when ``TEST_NEW_INTERPRETER_PER_COMMAND`` is set.
"""

from __future__ import annotations

import contextlib
import gc
import locale
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

#: Variables read when an interpreter or its C library starts, not when a command runs.
STARTUP_VARIABLES = ("LD_", "PYTHON", "LANG", "LC_", "TZ", "FAKETIME", "DONT_FAKE")

#: Largest request: the environment and arguments of one command (a datagram of the socket).
MAX_REQUEST = 1 << 20


def needs_new_interpreter(environ: Mapping[str, str], server_environ: Mapping[str, str]) -> bool:
    """Whether a command run with ``environ`` would start differently from the server."""
    names = {*environ, *server_environ}
    return any(name.startswith(STARTUP_VARIABLES) and environ.get(name) != server_environ.get(name) for name in names)


class CommandServer:
    """One server process and the client side of its socket. Commands run from several threads at
    once run side by side, each in a process of its own."""

    def __init__(self, cwd: Path) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="command-server-")
        self.path = os.path.join(self.folder.name, "socket")
        self.environ = dict(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.command_server", self.path],
            cwd=cwd,
            env=self.environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not os.path.exists(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the command server did not start")
            time.sleep(0.02)

    def run(
        self, args: Sequence[str | bytes], *, environ: Mapping[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """What ``python -m reports ARGS`` run with ``environ`` in ``cwd`` prints and exits with;
        :class:`subprocess.TimeoutExpired` (the command killed) after ``timeout`` seconds."""
        argv = ["reports", *map(os.fsdecode, args)]
        with (
            open(os.devnull, "rb") as stdin,
            tempfile.TemporaryFile() as stdout,
            tempfile.TemporaryFile() as stderr,
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection,
        ):
            connection.connect(self.path)
            request = pickle.dumps({"args": list(args), "environ": dict(environ), "cwd": str(cwd)})
            socket.send_fds(connection, [request], [stdin.fileno(), stdout.fileno(), stderr.fileno()])
            pid = int(connection.recv(64))
            connection.settimeout(timeout)
            try:
                returncode = int(connection.recv(64))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            return subprocess.CompletedProcess(argv, returncode, _read(stdout), _read(stderr))

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        self.folder.cleanup()


def _read(file: IO[bytes]) -> str:
    # As subprocess.run(text=True) decodes what a command printed.
    file.seek(0)
    text = file.read().decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def serve(path: str) -> dict[str, Any]:
    """Accept commands on ``path`` for ever; return a command's request, only in its child."""
    # What every command imports, imported once: each command's module and both databases' drivers.
    import importlib

    import psycopg  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401
    import sqlalchemy.dialects.sqlite.pysqlite  # noqa: F401

    from reports.cli.app import COMMAND_MODULES

    for module in set(COMMAND_MODULES.values()):
        importlib.import_module(f"reports.cli.{module}")
    # Out of the collector's reach: a child's first full collection would otherwise walk every
    # object imported here, copying each page of them from the server's, which took about half a
    # forked command's CPU.
    gc.freeze()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen()
    os.rename(path + ".new", path)
    # Gone with the pytest process that started it, even one killed with -9.
    parent = os.getppid()
    listener.settimeout(1)
    while True:
        _reap_waiters()
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:
                sys.exit(0)
            continue
        with connection:
            message, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST, 3)
            sys.stdout.flush()
            sys.stderr.flush()
            # Each command has a waiter process of its own, which reports its exit, so that commands
            # a test runs side by side (from threads) run side by side here too.
            if os.fork() == 0:
                listener.close()
                command = os.fork()
                if command == 0:
                    connection.close()
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                        os.close(fd)
                    return dict(pickle.loads(message))
                _wait_for(command, connection, fds)
            for fd in fds:
                os.close(fd)


def _wait_for(command: int, connection: socket.socket, fds: list[int]) -> NoReturn:
    """In a command's waiter: tell the client the command's pid, then how it exited."""
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        connection.sendall(str(command).encode())
        _, status = os.waitpid(command, 0)
        connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())
    os._exit(0)


def _reap_waiters() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def run_command(request: dict[str, Any]) -> None:
    """Become ``python -m reports`` with the request's arguments, environment and folder."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["environ"])
    # A new interpreter decodes its arguments from bytes as the file system's encoding does.
    sys.argv = ["reports", *(os.fsdecode(arg) for arg in request["args"])]
    runpy.run_module("reports", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_command(serve(sys.argv[1]))
