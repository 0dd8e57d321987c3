"""Fixtures shared by every test: real databases, a real Redis, real workers, a real SMTP server.

Services are found at the usual local addresses (override with TEST_POSTGRES_URL and
TEST_REDIS_URL). Locally a missing service skips its tests; in CI (``CI`` set) it fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import NoReturn, TypeVar

import psycopg
import pytest
import redis
from aiosmtpd.controller import Controller
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from bench.support import free_port, redis_server, temporary_database
from reports.database import create_db_engine, session_factory, upgrade
from reports.jobs import CoordinatorJob, ReportJob, SendNowJob
from reports.settings import Settings

POSTGRES_ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IN_CI = bool(os.environ.get("CI"))
REPO = Path(__file__).resolve().parent.parent


def missing(message: str) -> NoReturn:
    """A service or tool the test needs is not there: skip locally, fail in CI (which installs it)."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def _unavailable(what: str, error: Exception) -> NoReturn:
    missing(f"{what} is not reachable ({type(error).__name__}: {error})")


def wait_until(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.1, what: str = "condition"
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"Timed out after {timeout}s waiting for {what}.")
        time.sleep(interval)


# --- Redis -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as e:
        _unavailable("Redis", e)
    return REDIS_URL


@pytest.fixture
def broker_namespace(redis_url: str) -> Iterator[str]:
    """A Redis key namespace of the test's own, so tests share one Redis without seeing each other."""
    namespace = f"test-{uuid.uuid4().hex[:12]}"
    yield namespace
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        client.delete(*keys)


def redis_commands(client: redis.Redis) -> Counter[str]:
    """Commands the server has run since it started, by name (``INFO commandstats``), not counting
    INFO itself: on a private server, the difference of two readings is what ran in between."""
    stats = client.info("commandstats")
    return Counter(
        {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items() if name != "cmdstat_info"}
    )


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of the test's own on a free port, for tests that flush or kill Redis."""
    if shutil.which("redis-server") is None:
        _unavailable("redis-server", FileNotFoundError("redis-server is not installed"))
    with redis_server(tmp_path) as url:
        yield url


def month_from_now(offset: int) -> str:
    """``YYYY-MM`` of the UTC month ``offset`` months from the current one (negative: the past)."""
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1 + offset
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def queue_counts(settings: Settings) -> dict[str, int]:
    """Messages waiting in the default and bulk queues of the test's namespace."""
    return {
        queue: queued_messages(settings.broker_url, settings.broker_namespace, queue) for queue in ("default", "bulk")
    }


def messages_in_queue(settings: Settings, queue: str) -> list[dict]:
    """The decoded messages ready in ``queue``, in queue order."""
    client = redis.Redis.from_url(settings.broker_url)
    key = f"{settings.broker_namespace}:{queue}"
    return [json.loads(client.hget(f"{key}.msgs", message_id)) for message_id in client.lrange(key, 0, -1)]


JobT = TypeVar("JobT", CoordinatorJob, ReportJob, SendNowJob)


def jobs_in_queue(settings: Settings, queue: str, job: type[JobT]) -> list[JobT]:
    """The messages ready in ``queue``, parsed into jobs as their actor parses them."""
    return [job.parse(m["args"], m["kwargs"]) for m in messages_in_queue(settings, queue)]


def queued_messages(redis_url: str, namespace: str, queue: str) -> int:
    """Messages waiting in ``queue`` (ready and delayed)."""
    client = redis.Redis.from_url(redis_url)
    return client.llen(f"{namespace}:{queue}") + client.llen(f"{namespace}:{queue}.DQ")


# --- Databases -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_admin() -> str:
    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3):
            pass
    except psycopg.Error as e:
        _unavailable("PostgreSQL", e)
    return POSTGRES_ADMIN_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: every test runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'reports.db'}"
    else:
        with temporary_database(request.getfixturevalue("postgres_admin"), prefix="reports_test") as url:
            yield url


@pytest.fixture
def settings(database_url: str, broker_namespace: str, redis_url: str, tmp_path: Path) -> Settings:
    return Settings(
        var_dir=tmp_path / "var",
        database_url=database_url,
        broker_url=redis_url,
        broker_namespace=broker_namespace,
        mail_from="Monthly Reports <reports@reports.test>",
        # The fan-out, delivery and failure tests read figures out of v1's plain lines ("Total: …");
        # v2, the default, has its own tests (tests/unit/test_render_v2.py, test_pipeline.py).
        template_version="v1",
        plan_page_size=7,
        min_backoff_ms=200,
        max_backoff_ms=2_000,
        max_retries=5,
        claim_lease_seconds=5,
        smtp_timeout_seconds=3,
    )


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    """Sessions on the test's database, migrated to the newest schema."""
    upgrade(settings)
    engine = create_db_engine(settings.database_url)
    yield session_factory(engine)
    engine.dispose()


@dataclass
class Population:
    """Users loaded by plain SQL into the contract's schema, and what each should be told."""

    active: list[int] = field(default_factory=list)
    inactive: list[int] = field(default_factory=list)
    #: user id → (activity count, total in cents) within the period.
    expected: dict[int, tuple[int, int]] = field(default_factory=dict)


def load_users(
    sessions: sessionmaker[Session],
    *,
    count: int,
    period: str = "2026-10",
    inactive_every: int = 5,
    names: dict[int, str] | None = None,
) -> Population:
    """Insert ``count`` users (every ``inactive_every``-th inactive) with activities, by plain SQL.

    Each user ``i`` has ``i % 4`` activities in the period of ``100 * i`` cents each, one in the
    month before, and one in the month after (which must not be counted).
    """
    year, month = map(int, period.split("-"))
    inside, before = (
        f"{period}-15 12:00:00",
        f"{year if month > 1 else year - 1}-{(month - 2) % 12 + 1:02d}-20 08:00:00",
    )
    after = f"{year + month // 12}-{month % 12 + 1:02d}-01 00:00:00"
    population = Population()
    users, activities = [], []
    for user_id in range(1, count + 1):
        active = user_id % inactive_every != 0
        (population.active if active else population.inactive).append(user_id)
        name = (names or {}).get(user_id, f"User {user_id}")
        users.append({"id": user_id, "email": f"user{user_id}@example.test", "name": name, "active": active})
        n = user_id % 4
        population.expected[user_id] = (n, n * 100 * user_id)
        for k in range(n):
            activities.append(
                {"user_id": user_id, "at": inside, "category": ("food", "travel")[k % 2], "amount": 100 * user_id}
            )
        activities.append({"user_id": user_id, "at": before, "category": "food", "amount": 555})
        activities.append({"user_id": user_id, "at": after, "category": "food", "amount": 777})
    with sessions.begin() as session:
        session.execute(text("INSERT INTO users (id, email, name, active) VALUES (:id, :email, :name, :active)"), users)
        session.execute(
            text(
                "INSERT INTO activities (user_id, occurred_at, category, amount_cents) "
                "VALUES (:user_id, :at, :category, :amount)"
            ),
            activities,
        )
    return population


# --- SMTP ------------------------------------------------------------------------------------


#: Decides a reply for one delivery: given (recipient, 1-based attempt for that recipient), an SMTP
#: reply such as "550 5.1.1 No such user" to refuse it, or None to accept it.
Fault = Callable[[str, int], "str | None"]


class RecordingHandler:
    """Keeps every accepted message, parsed, with its envelope recipients; refuses what ``fault`` says."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[tuple[list[str], EmailMessage]] = []
        self.attempts: dict[str, int] = {}
        self.refused: list[tuple[str, str]] = []
        self.fault: Fault | None = None
        #: Decides a reply to RCPT TO, given the address: an SMTP reply to refuse it, or None.
        self.rcpt_fault: Callable[[str], str | None] | None = None
        #: Seconds each message takes, to stretch a run so it can be interrupted. Spent before the
        #: data, as a slow network or a slow provider would; the final "." is answered at once.
        self.delay_seconds = 0.0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # type: ignore[no-untyped-def]
        if self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)
        if self.rcpt_fault is not None and (reply := self.rcpt_fault(address)) is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]
        recipient = envelope.rcpt_tos[0]
        with self.lock:
            attempt = self.attempts[recipient] = self.attempts.get(recipient, 0) + 1
            reply = self.fault(recipient, attempt) if self.fault else None
            if reply is not None:
                self.refused.append((recipient, reply))
                return reply
            parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
            self.messages.append((list(envelope.rcpt_tos), parsed))
        return "250 Message accepted for delivery"


@dataclass
class SmtpServer:
    url: str
    handler: RecordingHandler
    controller: Controller

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    running: bool = True

    def stop(self) -> None:
        """Take the provider down (its port is free until :meth:`start`)."""
        if self.running:
            self.controller.stop()
            self.running = False

    def start(self) -> None:
        """Bring the provider back on the same port, keeping what it recorded."""
        self.controller = Controller(self.handler, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        self.running = True

    @property
    def messages(self) -> list[EmailMessage]:
        with self.handler.lock:
            return [message for _, message in self.handler.messages]

    def by_user(self) -> dict[int, list[EmailMessage]]:
        grouped: dict[int, list[EmailMessage]] = {}
        for message in self.messages:
            grouped.setdefault(int(message["X-Report-User-Id"]), []).append(message)
        return grouped


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    handler = RecordingHandler()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    server = SmtpServer(url=f"smtp://127.0.0.1:{port}", handler=handler, controller=controller)
    try:
        yield server
    finally:
        server.stop()


class LoopbackServer:
    """A TCP server on the loopback that hands each connection it accepts to ``handle``, in a thread
    of its own, and counts them; port 0 takes a free one."""

    def __init__(self, handle: Callable[[socket.socket], None], port: int = 0) -> None:
        self.handle = handle
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._server.settimeout(0.2)
        self.port = int(self._server.getsockname()[1])
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self.handle, args=(connection,), daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._server.close()


class DeadProvider(LoopbackServer):
    """A mail provider that is down: it accepts TCP connections, counts them, and drops them at once."""

    def __init__(self, port: int) -> None:
        super().__init__(lambda connection: connection.close(), port)


# --- Worker processes ------------------------------------------------------------------------


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


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process``'s whole process group (it leads one) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def start_workers(tmp_path: Path) -> Iterator[Callable[..., WorkerGroup]]:
    """Start real ``dramatiq actors`` workers with the given settings; all are stopped at teardown."""
    groups: list[WorkerGroup] = []

    def start(
        settings: Settings,
        *,
        processes: int = 2,
        threads: int = 4,
        queues: tuple[str, ...] = (),
        extra_args: tuple[str, ...] = (),
    ) -> WorkerGroup:
        log_path = tmp_path / f"workers-{len(groups)}.log"
        command = [
            sys.executable,
            "-m",
            "dramatiq",
            "actors",
            "--processes",
            str(processes),
            "--threads",
            str(threads),
            "--worker-shutdown-timeout",
            "10000",
            *extra_args,
        ]
        if queues:
            command += ["--queues", *queues]
        env = {**os.environ, **settings.as_environ()}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        group = WorkerGroup(process=process, log_path=log_path)
        groups.append(group)
        wait_until(
            lambda: group.log().count("Worker process is ready") >= processes or group.process.poll() is not None,
            timeout=30,
            what="workers to boot",
        )
        if group.process.poll() is not None:
            pytest.fail(f"Workers exited at start:\n{group.log()}")
        return group

    yield start
    for group in groups:
        group.stop(timeout=15)


def run_cli(settings: Settings, *args: str | bytes, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the ``reports`` command as an operator would, in a process of its own.

    An argument may be bytes, to pass what a shell would (including bytes that are not UTF-8).
    """
    return subprocess.run(
        [sys.executable, "-m", "reports", *args],
        env={**os.environ, **settings.as_environ()},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
