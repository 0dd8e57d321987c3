"""The Procfile as a platform runs it (issue 5, "Procfile"): every line works as written.

Each ``worker-*`` line names queues the actors declare, sets its processes, threads and a shutdown
timeout under the platform's 30 s grace period, and, started exactly as written, consumes its own
queue and no other. A worker told to listen on a queue nobody declares consumes nothing and says
nothing: that silent trap is what the first checks guard against. The ``release`` line migrates
a fresh database. A ``scheduler`` line, when there is one, stays up and exits 0 on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import redis
from sqlalchemy import inspect
from sqlalchemy.orm import Session, sessionmaker

from reports.clock import utcnow
from reports.database import create_db_engine
from reports.fanout import coordinator, runs
from reports.fanout.progress import count
from reports.jobs import (
    BUILD_REPORT,
    BULK_QUEUE,
    COORDINATOR,
    CRITICAL_QUEUE,
    DEFAULT_QUEUE,
    QUEUES,
    SEND_NOW,
    SendNowJob,
)
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import build_broker, send
from reports.worker.queues import queue_for
from tests.support.databases import load_users
from tests.support.environment import REPO
from tests.support.processes import free_port, kill_group, run_process, wait_for_actor_imports
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)]

PROCFILE = REPO / "Procfile"
#: Heroku's grace period between SIGTERM and SIGKILL, in milliseconds.
PLATFORM_GRACE_MS = 30_000
#: Longest a worker line's parent may wait for a worker process to boot before it watches them.
FORK_WAIT_MS = 5_000
DOMAIN = "reports.test"

#: Printed by a child process that imports the actors exactly as ``dramatiq actors`` does.
DECLARED = (
    "import json, dramatiq, actors; broker = dramatiq.get_broker(); "
    "print(json.dumps({'queues': sorted(broker.get_declared_queues()), "
    "'actors': {name: broker.get_actor(name).queue_name for name in broker.get_declared_actors()}}))"
)


# --- reading the Procfile --------------------------------------------------------------------


def read_procfile() -> dict[str, str]:
    """``name: command`` lines, in order; blank lines and comments are ignored."""
    entries: dict[str, str] = {}
    for line in PROCFILE.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, command = line.partition(":")
        assert colon and re.fullmatch(r"[A-Za-z0-9_-]+", name), f"not a Procfile line: {line!r}"
        assert name not in entries, f"process type {name!r} appears twice"
        assert command.strip(), f"{name} has no command"
        entries[name] = command.strip()
    return entries


def worker_lines(entries: dict[str, str]) -> dict[str, list[str]]:
    return {name: shlex.split(command) for name, command in entries.items() if name.startswith("worker")}


def _without_env_prefix(argv: list[str]) -> list[str]:
    """``env A=1 B=2 cmd …`` → ``cmd …``: the part a Procfile line runs after setting variables."""
    if argv[:1] != ["env"]:
        return argv
    rest = argv[1:]
    while rest and "=" in rest[0] and not rest[0].startswith("-"):
        rest = rest[1:]
    return rest


def option_values(argv: list[str], *names: str) -> list[str]:
    """Every value given to an option (``--queues a b``, ``-Q a``, ``--queues=a``), in order."""
    values: list[str] = []
    for i, arg in enumerate(argv):
        key, equals, inline = arg.partition("=")
        if key not in names:
            continue
        if equals:
            values.append(inline)
            continue
        for value in argv[i + 1 :]:
            if value.startswith("-"):
                break
            values.append(value)
    return values


def one_int(argv: list[str], *names: str) -> int:
    values = option_values(argv, *names)
    assert len(values) == 1, f"{' '.join(argv)}: expected one value for {names[0]}, got {values}"
    return int(values[0])


def line_queues(argv: list[str]) -> list[str]:
    return option_values(argv, "--queues", "-Q")


def pool_for(entries: dict[str, str], queue: str) -> tuple[str, list[str]]:
    [(name, argv)] = [(n, a) for n, a in worker_lines(entries).items() if queue in line_queues(a)]
    return name, argv


# --- running lines as written ----------------------------------------------------------------


def line_environment(settings: Settings) -> dict[str, str]:
    """The platform's environment: the app's config vars, and the app's executables on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, **settings.as_environ(), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


@dataclass
class LineProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """SIGTERM to the whole process group, as a platform does: every process at once."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        kill_group(self.process)


def stop_all(processes: list[LineProcess], timeout: float = 25) -> dict[str, int]:
    """SIGTERM every group, wait for each within ``timeout``, SIGKILL what is left; exit codes by name."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + timeout
    codes = {}
    for process in processes:
        try:
            codes[process.name] = process.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            codes[process.name] = process.process.returncode
    return codes


@pytest.fixture
def run_line(tmp_path: Path) -> Iterator[Callable[..., LineProcess]]:
    """Start a Procfile command as written, in its own process group; every one is stopped at teardown."""
    started: list[LineProcess] = []

    def start(name: str, argv: list[str], settings: Settings, *, ready_processes: int | None = None) -> LineProcess:
        log_path = tmp_path / f"{name}-{len(started)}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                argv,
                cwd=REPO,
                env=line_environment(settings),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = LineProcess(name, popen, log_path)
        started.append(process)
        if ready_processes:
            wait_until(
                lambda: process.log().count("Worker process is ready") >= ready_processes or popen.poll() is not None,
                timeout=30,
                what=f"{name} to boot",
            )
            assert popen.poll() is None, f"{name} exited at start:\n{process.log()}"
        return process

    yield start
    stop_all(started, timeout=20)


def waiting_in(settings: Settings, queue: str) -> int:
    """Messages ready or delayed in ``queue`` (Dramatiq 2.2's delay queue ``X.DQ`` is a list)."""
    client = redis.Redis.from_url(settings.broker_url)
    ns = settings.broker_namespace
    return client.llen(f"{ns}:{queue}") + client.llen(f"{ns}:{queue}.DQ")


def assert_quiet(process: LineProcess) -> None:
    noisy = [line for line in process.log().splitlines() if re.search(r"\[(WARNING|ERROR|CRITICAL)\]|Traceback", line)]
    assert noisy == [], f"{process.name} logged:\n" + "\n".join(noisy)


# --- the lines -------------------------------------------------------------------------------


def test_each_worker_line_names_declared_queues_and_sets_processes_threads_and_a_shutdown_timeout(settings):
    entries = read_procfile()
    workers = worker_lines(entries)
    declared = subprocess.run(
        [sys.executable, "-c", DECLARED],
        cwd=REPO,
        env=line_environment(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert declared.returncode == 0, declared.stderr
    found = json.loads(declared.stdout)
    actor_queues = set(found["actors"].values())
    # Every actor is on one of the three priority queues, and each queue has an actor.
    assert actor_queues == set(QUEUES), found
    assert {found["actors"][spec.name] for spec in (SEND_NOW, COORDINATOR, BUILD_REPORT)} == set(QUEUES)
    assert (found["actors"][SEND_NOW.name], found["actors"][COORDINATOR.name], found["actors"][BUILD_REPORT.name]) == (
        CRITICAL_QUEUE,
        DEFAULT_QUEUE,
        BULK_QUEUE,
    )

    assert workers, f"no worker-* lines in {PROCFILE}"
    for name, argv in workers.items():
        command = _without_env_prefix(argv)
        assert command[:2] == ["dramatiq", "actors"], f"{name}: {argv}"
        queues = line_queues(argv)
        assert queues, f"{name} listens on every queue: give it --queues"
        unknown = set(queues) - set(found["queues"])
        assert not unknown, f"{name} listens on queues no actor declares: {sorted(unknown)}"
        assert one_int(argv, "--processes", "-p") >= 1, name
        assert one_int(argv, "--threads", "-t") >= 1, name
        assert 0 < one_int(argv, "--worker-shutdown-timeout") < PLATFORM_GRACE_MS, name
        assert 0 < one_int(argv, "--worker-fork-timeout") <= FORK_WAIT_MS, name
    for queue in QUEUES:
        owners = [name for name, argv in workers.items() if queue in line_queues(argv)]
        assert len(owners) == 1, f"queue {queue!r} is consumed by {owners or 'no pool'}"
    # A pool per priority: no line mixes the critical queue with the others.
    assert line_queues(pool_for(entries, CRITICAL_QUEUE)[1]) == [CRITICAL_QUEUE]


def test_the_release_line_as_written_migrates_a_fresh_database(settings):
    entries = read_procfile()
    assert "release" in entries, f"no release line in {PROCFILE}"
    argv = shlex.split(entries["release"])
    assert argv == ["reports", "db", "upgrade"], argv
    for _ in range(2):  # and again on the next release: nothing to do
        result = subprocess.run(
            argv, cwd=REPO, env=line_environment(settings), capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stderr
    engine = create_db_engine(settings.database_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"users", "activities", "period_runs", "report_items", "deliveries", "resends"} <= tables


def test_each_worker_line_as_written_consumes_its_own_queue_and_no_other(
    settings, sessions: sessionmaker[Session], smtp_server, run_line
):
    settings = replace(settings, smtp_url=smtp_server.url)
    entries = read_procfile()
    population = load_users(sessions, count=3, inactive_every=1000)
    broker = build_broker(settings)
    september, october = Period(2026, 9), Period(2026, 10)

    def waiting(queue: str) -> int:
        return waiting_in(settings, queue)

    def complete(period: Period) -> bool:
        with sessions.begin() as session:
            return count(session, period).complete

    # bulk: September planned here, its build_report messages waiting.
    with sessions.begin() as session:
        runs.trigger(session, september, template_version=settings.template_version, now=utcnow())
    coordinator.walk_slice(sessions, september, queue_for(broker), page_size=7, budget_seconds=60)
    # default: October triggered, its coordinator waiting.
    runs.trigger_and_enqueue(
        sessions, queue_for(broker), october, template_version=settings.template_version, now=utcnow()
    )
    # critical: user 1's October report, asked for now.
    job = SendNowJob(october, 1, "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", settings.template_version)
    send(broker, SEND_NOW, job.payload())
    broker.close()
    assert {queue: waiting(queue) for queue in QUEUES} == {CRITICAL_QUEUE: 1, DEFAULT_QUEUE: 1, BULK_QUEUE: 3}

    started = []
    for queue in QUEUES:  # one pool at a time: each takes its own queue and leaves the others
        name, argv = pool_for(entries, queue)
        started.append(run_line(name, argv, settings, ready_processes=one_int(argv, "--processes", "-p")))
        if queue == CRITICAL_QUEUE:
            wait_until(lambda: smtp_server.messages, timeout=30, what="the critical pool to send")
            time.sleep(1)
            [message] = smtp_server.messages
            assert message["Message-ID"].strip() == f"<report.2026-10.1@{DOMAIN}>"
            assert {q: waiting(q) for q in QUEUES} == {CRITICAL_QUEUE: 0, DEFAULT_QUEUE: 1, BULK_QUEUE: 3}
        elif queue == DEFAULT_QUEUE:
            wait_until(
                lambda: waiting(DEFAULT_QUEUE) == 0 and waiting(BULK_QUEUE) == 6,
                timeout=30,
                what="the default pool to walk October",
            )
            time.sleep(1)
            assert {q: waiting(q) for q in QUEUES} == {CRITICAL_QUEUE: 0, DEFAULT_QUEUE: 0, BULK_QUEUE: 6}
            assert len(smtp_server.messages) == 1, "a pool other than bulk sent monthly emails"
        else:
            wait_until(
                lambda: complete(september) and complete(october),
                timeout=60,
                what="the bulk pool to finish both periods",
            )

    sent = sorted((m["X-Report-Period"], int(m["X-Report-User-Id"])) for m in smtp_server.messages)
    assert sent == sorted((p, u) for p in ("2026-09", "2026-10") for u in population.active)
    for process in started:
        assert process.process.poll() is None, f"{process.name} died:\n{process.log()}"
        assert_quiet(process)

    if "scheduler" in entries:
        scheduler = run_line("scheduler", shlex.split(entries["scheduler"]), settings)
        time.sleep(3)
        assert scheduler.process.poll() is None, f"the scheduler exited:\n{scheduler.log()}"
        started.append(scheduler)

    # The platform stops the dyno: SIGTERM to every process at once; each line drains and exits 0.
    codes = stop_all(started)
    assert codes == {process.name: 0 for process in started}, codes


def test_a_deploy_that_signals_a_worker_line_while_it_boots_is_a_clean_stop(settings, run_line):
    # A deploy signals the whole group at once, worker processes still importing the actors
    # included; their master passes the same request on once they have booted.
    name, argv = pool_for(read_procfile(), BULK_QUEUE)
    processes = one_int(argv, "--processes", "-p")
    line = run_line(name, argv, settings)
    workers = wait_for_actor_imports(line.process, processes)
    line.terminate()

    assert line.process.wait(timeout=30) == 0, line.log()
    log = line.log()
    for worker in workers:
        own = [entry for entry in log.splitlines() if f"[PID {worker}]" in entry]
        stopping = next(i for i, entry in enumerate(own) if "Stopping worker process" in entry)
        ready = next((i for i, entry in enumerate(own) if "ready for action" in entry), len(own))
        assert stopping < ready, f"the signal came after PID {worker} booted: this test needs it before\n{log}"
    assert "Killing worker process" not in log, log
    assert "Ignoring a repeated SIGTERM" in log, log
    assert_quiet(line)


def test_a_worker_process_killed_while_it_starts_stops_its_line_within_seconds(settings, run_line):
    # Dramatiq's parent waits up to --worker-fork-timeout for each worker process to boot before it
    # watches them at all (30 s by default); a line that exits is one the platform restarts.
    name, argv = pool_for(read_procfile(), BULK_QUEUE)
    processes = one_int(argv, "--processes", "-p")
    line = run_line(name, argv, settings)
    first, *_ = wait_for_actor_imports(line.process, processes)
    os.kill(first, signal.SIGKILL)

    try:
        code = line.process.wait(timeout=FORK_WAIT_MS / 1000 + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} still ran with a dead worker process:\n{line.log()}")
    assert code != 0
    assert f"Worker with PID {first} exited unexpectedly" in line.log(), line.log()


def test_a_worker_on_a_misspelled_queue_consumes_nothing_and_says_nothing(
    settings, sessions: sessionmaker[Session], smtp_server, run_line
):
    """The trap the Procfile checks guard against: Dramatiq accepts any queue name in silence."""
    settings = replace(settings, smtp_url=smtp_server.url)
    load_users(sessions, count=1, inactive_every=1000)
    _, argv = pool_for(read_procfile(), CRITICAL_QUEUE)
    at = argv.index(next(a for a in argv if a in ("--queues", "-Q")))
    misspelled = [*argv[: at + 1], "no-such-queue", *argv[at + 2 :]]
    assert line_queues(misspelled) == ["no-such-queue"]

    broker = build_broker(settings)
    send(
        broker,
        SEND_NOW,
        SendNowJob(Period(2026, 10), 1, "0b9a8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d", settings.template_version).payload(),
    )
    broker.close()
    worker = run_line("misspelled", misspelled, settings, ready_processes=one_int(argv, "--processes", "-p"))
    time.sleep(3)

    assert worker.process.poll() is None, "the worker exited instead of idling"
    assert waiting_in(settings, CRITICAL_QUEUE) == 1
    assert smtp_server.messages == []
    assert_quiet(worker)
    assert "no-such-queue" not in worker.log()
    assert stop_all([worker]) == {"misspelled": 0}


@pytest.mark.parametrize(
    "command",
    [
        pytest.param([sys.executable, "-m", "scheduler"], id="scheduler"),
        pytest.param([sys.executable, "-m", "dramatiq", "actors", "--processes", "2", "--threads", "1"], id="workers"),
    ],
)
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DATABASE_URL", "postgresql+psycopg://app:s3cretpw@db:notaport/reports"),
        ("BROKER_URL", "redis://:s3cretpw@127.0.0.1:6379/notadb"),
    ],
)
def test_a_process_with_a_malformed_url_exits_2_with_one_line_a_process_and_no_password(
    settings, command, variable, value
):
    result = run_process(settings, command, environ={variable: value})

    described = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, described
    # Dramatiq's parent process logs its own lines (booting, a worker exited); ours is one line.
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert 1 <= len(errors) <= 2 and all(line.startswith(f"error: {variable} must") for line in errors), described
    assert "Traceback" not in result.stderr, described
    assert "s3cretpw" not in result.stdout + result.stderr, described


def test_the_web_line_as_written_serves_healthz_on_port_and_exits_0_on_sigterm(settings, sessions, tmp_path):
    """A PaaS sets PORT, expands it in the line, and SIGTERMs every process at once."""
    command = read_procfile()["web"]
    assert "$PORT" in command
    port = free_port()
    log_path = tmp_path / "web.log"
    with log_path.open("wb") as log:
        # PORT is the platform's, not a setting; expanded as the platform's shell does, then exec'd.
        argv = [word.replace("$PORT", str(port)) for word in shlex.split(command)]
        popen = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Listening beyond this machine, it needs a secret of its own to sign links with.
            env={**line_environment(settings), "PORT": str(port), "UNSUBSCRIBE_SECRET": "s" * 32},
        )
    process = LineProcess("web", popen, log_path)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return popen.poll() is not None

    try:
        wait_until(healthy, timeout=30, what="the web line to answer /healthz")
        assert popen.poll() is None, process.log()
        assert stop_all([process], timeout=15) == {"web": 0}, process.log()
    finally:
        process.kill()
