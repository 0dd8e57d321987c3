"""Fixtures shared by every test: real databases, a real Redis and RabbitMQ, SQS on moto's server,
real workers, a real SMTP server.

The helpers they are built on, which tests import too, are in tests/support.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
import redis
from aiosmtpd.controller import Controller
from sqlalchemy import make_url
from sqlalchemy.orm import Session, sessionmaker

from reports.database import create_db_engine, session_factory, upgrade
from reports.settings import Settings
from tests.support.databases import temporary_database
from tests.support.environment import POSTGRES_ADMIN_URL, REDIS_URL, REPO, unavailable
from tests.support.processes import WorkerGroup, free_port, redis_server
from tests.support.rabbitmq import temporary_vhost
from tests.support.smtp import RecordingHandler, SmtpServer
from tests.support.sqs import CREDENTIALS, moto_server, temporary_prefix
from tests.support.waiting import wait_until
from tests.support.web import SECRET, WebProcess, request

# --- Redis -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as e:
        unavailable("Redis", e)
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


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of the test's own on a free port, for tests that flush or kill Redis."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server", FileNotFoundError("redis-server is not installed"))
    with redis_server(tmp_path) as url:
        yield url


# --- RabbitMQ --------------------------------------------------------------------------------


@pytest.fixture
def rabbitmq_url() -> Iterator[str]:
    """The amqp URL of a RabbitMQ vhost of the test's own, deleted with its queues after: Dramatiq's
    RabbitMQ broker has no key namespace, so the vhost is what keeps tests apart."""
    with temporary_vhost() as url:
        yield url


# --- Amazon SQS ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server on a loopback port, one per test process: SQS for the tests on it."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def sqs_url(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The sqs:// URL of a queue-name prefix of the test's own on moto's server, its queues deleted
    after; the processes the test starts inherit moto's dummy credentials."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with temporary_prefix(moto_endpoint) as url:
        yield url


# --- Databases -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_admin() -> str:
    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3):
            pass
    except psycopg.Error as e:
        unavailable("PostgreSQL", e)
    return POSTGRES_ADMIN_URL


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to the newest schema once per test process, for tests to copy."""
    path = tmp_path_factory.mktemp("migrated") / "reports.db"
    upgrade(Settings(database_url=f"sqlite:///{path}"))
    # The copy is of the file alone: a write-ahead log beside it would hold part of the schema.
    assert not path.with_name(f"{path.name}-wal").exists()
    return path


@pytest.fixture(scope="session")
def migrated_postgres(postgres_admin: str) -> Iterator[str]:
    """A PostgreSQL database migrated to the newest schema once per test process, for tests to copy
    (``CREATE DATABASE … TEMPLATE``); its name."""
    with temporary_database(postgres_admin, prefix="reports_template") as url:
        upgrade(Settings(database_url=url))
        yield make_url(url).database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database: every test runs once on SQLite and once on PostgreSQL.

    It is empty, but for a test that asks for ``sessions``, which gets it at the newest schema as a
    copy of one migrated once per test process: running every migration again takes a fifth of a
    second or more, for each of several hundred tests.
    """
    migrated = "sessions" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "reports.db"
        if migrated:
            shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        yield f"sqlite:///{path}"
    else:
        template = request.getfixturevalue("migrated_postgres") if migrated else None
        with temporary_database(request.getfixturevalue("postgres_admin"), template=template) as url:
            yield url


#: The brokers a test marked ``both_brokers`` runs on; each but Redis has a URL fixture of its name.
BROKER_KINDS = ("redis", "rabbitmq", "sqs")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``both_brokers`` runs on every broker: Redis, RabbitMQ and SQS (on PostgreSQL
    only but on Redis)."""
    if metafunc.definition.get_closest_marker("both_brokers"):
        metafunc.parametrize("broker_kind", BROKER_KINDS, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The other brokers' runs test the broker; SQLite's are the Redis runs'. Halves their slow acceptance runs.
    items[:] = [
        item
        for item in items
        if not (
            getattr(item, "callspec", None)
            and item.callspec.params.get("broker_kind", "redis") != "redis"
            and item.callspec.params.get("database_url") == "sqlite"
        )
    ]


@pytest.fixture
def broker_kind(request: pytest.FixtureRequest) -> str:
    """``redis``, or another of :data:`BROKER_KINDS` in the runs of a test marked ``both_brokers``."""
    return getattr(request, "param", "redis")


@pytest.fixture
def settings(
    request: pytest.FixtureRequest,
    broker_kind: str,
    database_url: str,
    broker_namespace: str,
    redis_url: str,
    tmp_path: Path,
) -> Settings:
    """The test's settings: Redis as the broker, or with ``both_brokers`` also a RabbitMQ vhost or
    an SQS queue-name prefix of its own (Redis then holds only the shared state, under the test's
    namespace)."""
    on_redis = broker_kind == "redis"
    lease = request.node.get_closest_marker("claim_lease_seconds")
    return Settings(
        var_dir=tmp_path / "var",
        database_url=database_url,
        broker_url=redis_url if on_redis else request.getfixturevalue(f"{broker_kind}_url"),
        redis_url="" if on_redis else redis_url,
        broker_namespace=broker_namespace,
        mail_from="Monthly Reports <reports@reports.test>",
        # The fan-out, delivery and failure tests read figures out of v1's plain lines ("Total: …");
        # v2, the default, has its own tests (tests/unit/test_render_v2.py, test_pipeline.py).
        template_version="v1",
        plan_page_size=7,
        min_backoff_ms=200,
        max_backoff_ms=2_000,
        max_retries=5,
        # Short, so that the crash tests see a dead worker's claims expire within seconds. Tests that
        # run the pipeline in-process and time no lease ask for a longer one: a send starts only
        # with the SMTP deadline and a second to record it left of the lease, which leaves 1 s of 5
        # for the claim and the render, overrun on a loaded machine ("too little of the lease left").
        claim_lease_seconds=lease.args[0] if lease else 5,
        smtp_timeout_seconds=3,
        # On SQS a dead worker's messages come back when this runs out: no sooner than its claims.
        sqs_visibility_timeout_seconds=5,
    )


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    """Sessions on the test's database at the newest schema: ``upgrade`` migrates it, or finds it
    migrated already (see ``database_url``)."""
    upgrade(settings)
    engine = create_db_engine(settings.database_url)
    yield session_factory(engine)
    engine.dispose()


# --- SMTP ------------------------------------------------------------------------------------


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


# --- Worker processes ------------------------------------------------------------------------


@pytest.fixture
def start_workers(tmp_path: Path) -> Iterator[Callable[..., WorkerGroup]]:
    """Start real ``dramatiq actors`` workers with the given settings (and ``env`` on top of them);
    all are killed at teardown."""
    groups: list[WorkerGroup] = []

    def start(
        settings: Settings,
        *,
        processes: int = 2,
        threads: int = 4,
        queues: tuple[str, ...] = (),
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        booted: bool = True,
    ) -> WorkerGroup:
        """``booted=False``: return at once, not once every worker process is ready."""
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
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                env={**os.environ, **settings.as_environ(), **(env or {})},
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        group = WorkerGroup(process=process, log_path=log_path)
        groups.append(group)
        if not booted:
            return group
        wait_until(
            lambda: group.log().count("Worker process is ready") >= processes or group.process.poll() is not None,
            timeout=30,
            what="workers to boot",
        )
        if group.process.poll() is not None:
            pytest.fail(f"Workers exited at start:\n{group.log()}")
        return group

    yield start
    # The test has checked what it checks by now. A graceful stop would take Dramatiq two to three
    # seconds a group (its main thread looks for the signal once a second, its consumers wait out
    # a fetch); the tests of stopping stop their workers themselves.
    for group in groups:
        group.kill()


# --- The web process -------------------------------------------------------------------------


@pytest.fixture
def start_web(
    settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> Iterator[Callable[..., WebProcess]]:
    """Start `reports web` on a free port, PUBLIC_BASE_URL pointing at it, with ``overrides`` of the
    settings; stopped (SIGTERM) at teardown."""
    started: list[WebProcess] = []

    def start(secret: str = SECRET, **overrides: object) -> WebProcess:
        port = free_port()
        web_settings = replace(
            settings, public_base_url=f"http://127.0.0.1:{port}", unsubscribe_secret=secret, **overrides
        )
        log_path = tmp_path / f"web-{len(started)}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "reports", "web", "--host", "127.0.0.1", "--port", str(port)],
                env={**os.environ, **web_settings.as_environ()},
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        web = WebProcess(process, f"http://127.0.0.1:{port}", web_settings, log_path)
        started.append(web)
        wait_until(
            lambda: process.poll() is not None or request(f"{web.base_url}/healthz")[0] == 200,
            timeout=30,
            what="reports web to answer /healthz",
        )
        assert process.poll() is None, web.log()
        return web

    yield start
    for web in started:
        web.stop()
