"""What the benchmarks set up: seeded users, real worker pools and their memory, RabbitMQ vhosts of their
own, and (from tests/support, shared with the test suite) a PostgreSQL database of their own, dropped after,
and a private redis-server."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit, urlunsplit

#: The repository's root: where worker pools run (``dramatiq actors`` imports ``actors`` from there).
ROOT = Path(__file__).resolve().parent.parent
# A benchmark runs as a plain script, with bench/ on sys.path but not the repository, which holds
# the helpers the benchmarks share with the tests. First, before anything imports ``reports``: a
# checkout that shares another's virtualenv would otherwise run the code the virtualenv was
# installed from, the other checkout's, and migrate its database with that checkout's migrations.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pika
import pika.exceptions
import proc_cpu  # bench/proc_cpu.py, beside this file
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.database import create_db_engine, session_factory, upgrade
from reports.fanout import progress
from reports.models import User
from reports.ops.seed import seed
from reports.periods import Period, previous_month
from reports.settings import ENVIRONMENT, Settings

# Defined once, in tests/support; the benchmarks import them from here.
from tests.support.databases import in_autocommit as in_autocommit
from tests.support.databases import pg_connect as pg_connect
from tests.support.databases import temporary_database as temporary_database
from tests.support.processes import free_port as free_port
from tests.support.processes import redis_server as redis_server

if TYPE_CHECKING:
    from smtp_sink import SmtpSink


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt, so a benchmark stopped that way still stops what it started."""

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)


#: The RabbitMQ node the benchmarks make their vhosts on (its default vhost is never used itself).
RABBITMQ_URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
#: Seconds one ``rabbitmqctl`` call may take; it answers in about half a second on a running node.
RABBITMQCTL_TIMEOUT = 30


class Vhosts:
    """RabbitMQ vhosts ``bench-<12 hex>`` of a benchmark's own, made with ``rabbitmqctl`` on this machine's
    node for the user of ``admin_url``; each deleted by :meth:`delete`, and whatever is left by
    :meth:`delete_all` (call it in a ``finally``: Ctrl-C included). Safe to use from several threads.

    Dramatiq's RabbitMQ broker has no key namespace: a vhost is what keeps a run's queues apart.
    """

    def __init__(self, admin_url: str = RABBITMQ_URL) -> None:
        self.admin_url = admin_url
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._closed = False

    def check(self) -> str:
        """Raise RuntimeError unless rabbitmqctl is installed and the node answers; its version."""
        if shutil.which("rabbitmqctl") is None:
            raise RuntimeError("rabbitmqctl is not installed (Debian package rabbitmq-server)")
        parameters = pika.URLParameters(self.admin_url)
        parameters.socket_timeout = parameters.blocked_connection_timeout = 5
        parameters.connection_attempts = 1
        try:
            connection = pika.BlockingConnection(parameters)
        except pika.exceptions.AMQPError as error:
            raise RuntimeError(f"RabbitMQ at {_host_port(self.admin_url)} cannot be reached: {error!r}") from None
        try:
            version = connection._impl.server_properties.get("version", b"?")
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            connection.close()

    def create(self) -> tuple[str, str]:
        """A new empty vhost the URL's user may use: (its name, its amqp URL)."""
        parts = urlsplit(self.admin_url)
        name = f"bench-{uuid.uuid4().hex[:12]}"
        # Under the lock throughout: delete_all, from another thread, waits for a vhost being made.
        with self._lock:
            if self._closed:
                raise RuntimeError("the benchmark is shutting down")
            self._live.add(name)  # before it exists, so that an interrupted add is deleted all the same
            _rabbitmqctl("add_vhost", name)
            _rabbitmqctl("set_permissions", "-p", name, unquote(parts.username or "guest"), ".*", ".*", ".*")
        return name, urlunsplit(parts._replace(path="/" + quote(name, safe="")))

    def delete(self, name: str) -> None:
        """Delete the vhost with its queues; one that was never made is no error."""
        with self._lock:
            if name not in self._live:
                return
            self._live.discard(name)
        try:
            _rabbitmqctl("delete_vhost", name)
        except subprocess.CalledProcessError as error:
            if b"does not exist" not in error.stderr + error.stdout:
                print(
                    f"warning: rabbitmqctl delete_vhost {name} failed: {error.stderr.decode().strip()}", file=sys.stderr
                )
        except subprocess.TimeoutExpired:
            print(f"warning: rabbitmqctl delete_vhost {name} timed out: delete it by hand", file=sys.stderr)

    def delete_all(self) -> None:
        """Delete every vhost still live and refuse new ones."""
        with self._lock:
            self._closed = True
            live = sorted(self._live)
        for name in live:
            self.delete(name)


def _rabbitmqctl(*args: str) -> None:
    # A session of its own: a Ctrl-C meant for the benchmark does not cut a call short (the
    # benchmark's clean-up then runs its own calls).
    subprocess.run(
        ["rabbitmqctl", "-q", *args],
        check=True,
        capture_output=True,
        timeout=RABBITMQCTL_TIMEOUT,
        start_new_session=True,
    )


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5672}"


@contextlib.contextmanager
def rabbitmq_vhost(admin_url: str = RABBITMQ_URL) -> Iterator[str]:
    """The amqp URL of a :class:`Vhosts` vhost of the caller's own, deleted with its queues after."""
    vhosts = Vhosts(admin_url)
    try:
        yield vhosts.create()[1]
    finally:
        vhosts.delete_all()


def seed_users(
    database_url: str, *, users: int, period: Period, inactive_percent: int = 10, chunk: int = 50_000
) -> set[int]:
    """Add demo users with activities the way ``reports seed`` does (``reports.ops.seed.seed``), committed
    ``chunk`` users at a time so a large seed stays small in memory; then VACUUM ANALYZE.

    Returns the ids of the active users: those a period run reports on.
    """
    engine = create_db_engine(database_url)
    try:
        sessions = session_factory(engine)
        for index, start in enumerate(range(0, users, chunk)):
            with sessions.begin() as session:
                # One chunk is exactly `reports seed --users N`; later chunks draw other random numbers.
                seed(
                    session,
                    users=min(chunk, users - start),
                    period=period,
                    inactive_percent=inactive_percent,
                    seed=index + 1,
                )
        with sessions.begin() as session:
            active = set(session.scalars(select(User.id).where(User.active)))
    finally:
        engine.dispose()
    with pg_connect(database_url) as connection:
        connection.execute("VACUUM ANALYZE")
    return active


@dataclass(frozen=True)
class MailBench:
    """A database with seeded users, a private Redis and an SMTP sink: what a run that mails needs."""

    workdir: Path
    settings: Settings
    sink: SmtpSink
    #: Last month: the seeded activities are in it and the month before.
    period: Period
    #: The active users' ids: those a period run mails.
    active: set[int]


@contextlib.contextmanager
def mail_bench(*, users: int, inactive_percent: int, prefix: str) -> Iterator[MailBench]:
    """Set up a :class:`MailBench` in a temporary folder (worker logs go there); take it all down after."""
    from smtp_sink import SmtpSink  # bench/smtp_sink.py, beside this file

    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    period = previous_month(utcnow())
    try:
        with redis_server(workdir) as redis_url, SmtpSink() as sink, temporary_database() as url:
            settings = Settings(
                var_dir=workdir / "var",
                database_url=url,
                broker_url=redis_url,
                broker_namespace="bench",
                smtp_url=sink.url,
                mail_from="Monthly Reports <reports@bench.test>",
            )
            upgrade(settings)
            started = time.monotonic()
            active = seed_users(url, users=users, period=period, inactive_percent=inactive_percent)
            print(
                f"{users:,} users seeded ({len(active):,} active) with activities in {period.previous()} and "
                f"{period} in {time.monotonic() - started:.1f} s; nproc {os.cpu_count()}; "
                f"{datetime.now():%Y-%m-%d %H:%M}",
                flush=True,
            )
            yield MailBench(workdir, settings, sink, period, active)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def settings_environ(settings: Settings) -> dict[str, str]:
    """This process's environment with none of the project's variables but ``settings``' own."""
    env = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT.values() and not k.startswith("dramatiq_")}
    env.update(settings.as_environ())
    return env


def python_of(root: Path) -> str:
    """The Python that runs the checkout at ``root``: this process's for this one, else its ``.venv``'s."""
    return sys.executable if root.resolve() == ROOT else str(root.resolve() / ".venv" / "bin" / "python")


class Pools:
    """Worker pools started like Procfile lines, each in a session of its own; all stopped at the end."""

    def __init__(self, workdir: Path, env: dict[str, str], *, root: Path = ROOT) -> None:
        """:param root: the checkout whose code the workers run, with its own ``.venv`` (this one's by default)."""
        self.workdir, self.env, self.root = workdir, env, root
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(
        self, name: str, queue: str, processes: int, threads: int, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log_path = self.workdir / f"{name}.log"
        argv = [
            python_of(self.root),
            "-m",
            "dramatiq",
            "actors",
            "--queues",
            queue,
            "--processes",
            str(processes),
            "--threads",
            str(threads),
            "--worker-shutdown-timeout",
            "20000",
            "--worker-fork-timeout",
            "5000",
        ]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv,
                cwd=self.root,
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started.append((name, process, log_path))
        deadline = time.monotonic() + 60
        while log_path.read_text(errors="replace").count("Worker process is ready") < processes:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} pool did not boot; see {log_path}:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        return process

    def check(self) -> None:
        """Raise if a pool has exited."""
        for name, process, log_path in self.started:
            if process.poll() is not None:
                raise RuntimeError(f"{name} pool exited with {process.returncode}; see {log_path}")

    def stop_all(self) -> None:
        for _, process, _ in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 25
        for _, process, _ in self.started:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.started.clear()


def watch_period(
    sessions: sessionmaker[Session],
    period: Period,
    *,
    expected: int,
    timeout: float,
    interval: float = 0.25,
    on_progress: Callable[[progress.Progress], None] | None = None,
    alive: Callable[[], None] = lambda: None,
) -> tuple[progress.Progress, float | None]:
    """Poll the period's progress (``reports.fanout.progress.count``) until it is complete with ``expected`` items.

    Calls ``on_progress`` with each reading and ``alive`` between readings (to raise if workers died);
    returns the last reading and the monotonic time the walk was first seen planned.
    """
    deadline = time.monotonic() + timeout
    planned_at = None
    while True:
        with sessions.begin() as session:
            current = progress.count(session, period)
        if current.planned and planned_at is None:
            planned_at = time.monotonic()
        if on_progress is not None:
            on_progress(current)
        if current.complete and current.total >= expected:
            return current, planned_at
        if time.monotonic() > deadline:
            raise RuntimeError(f"period not complete after {timeout:.0f} s: {current}")
        alive()
        time.sleep(interval)


def tree_rss_kib(root: int) -> dict[int, int]:
    """VmRSS (KiB) of ``root`` and every process below it, read from /proc; by pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])  # the name, in parentheses, may hold spaces
            children.setdefault(parent, []).append(int(entry))
    rss: dict[int, int] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss[pid] = int(line.split()[1])
    return rss


def postgres_cpu_seconds() -> float | None:
    """CPU seconds the PostgreSQL server on this machine has used so far, every process of it.

    The live processes' own time, plus what the postmaster has collected from the children that
    exited (its ``cutime``/``cstime``), so backends that come and go in between are counted too.
    ``None`` when no PostgreSQL runs here (a remote server): then nothing can be read.
    """
    snapshot = proc_cpu.stats()
    root = proc_cpu.postmaster(snapshot)
    return None if root is None else sum(proc_cpu.tree(root, snapshot).values())
