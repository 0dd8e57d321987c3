"""Benchmark: time from ``kill -9`` of a worker's process group to the redelivery of its message.

Usage (from the repository root)::

    .venv/bin/python bench/recovery.py --runs 5 --default-runs 3 --rabbitmq-runs 5

Three modes are measured side by side in one run of this script:

- ``project``: workers built like the real ones (``reports.worker.broker.build_broker(Settings.from_env())``
  plus the ``Heartbeat`` middleware, as in ``actors/__init__.py``), so the project's
  ``heartbeat_timeout_ms`` and ``maintenance_chance`` apply (defaults 10000 ms and 1000000/1e6,
  or whatever ``HEARTBEAT_TIMEOUT_MS`` / ``MAINTENANCE_CHANCE`` say in this environment).
- ``defaults``: a plain Dramatiq ``RedisBroker`` (heartbeat timeout 60000 ms, maintenance chance
  1000/1e6) and no ``Heartbeat`` middleware.
- ``rabbitmq``: workers built like the real ones on RabbitMQ (``BROKER_URL`` a vhost of the run's own,
  ``REDIS_URL`` the bench's Redis, where the actor records its starts). The heartbeat settings do not
  apply: RabbitMQ returns a consumer's unacked messages when its connection drops, which a
  ``kill -9`` does at once. Needs ``rabbitmqctl`` and a running node (``--rabbitmq-url``); each run
  makes a vhost ``bench-<hex>`` and deletes it after. ``--rabbitmq-runs 0`` leaves the mode out.

Each run, in a fresh broker namespace: two worker process groups (``python -m dramatiq
bench.recovery_actors --processes 1 --threads 1``, each its own session) boot; one ``hold`` message
is enqueued; the group that starts it is killed with SIGKILL (``os.killpg``) while the other stands
by idle; the recovery time is the wall-clock time the message starts again in the standby group,
as recorded by the actor, minus the kill time.

On RabbitMQ the message is enqueued only once both groups consume the queue (RabbitMQ's consumer
count), so that the standby group is subscribed when the kill comes.

The project runs go one after another, and so do the RabbitMQ runs, beside them; the defaults runs,
which take minutes each, run at the same time as each other and as the project and RabbitMQ runs
(separate namespaces and vhosts, so they do not interact).

By default the bench starts a private ``redis-server`` on a free loopback port, so nothing else
using the shared Redis (a test that flushes it, say) can disturb a run; ``--redis-url`` uses an
existing server instead (the bench then deletes the keys it wrote).

Every process the bench starts is killed (whole process group) on the way out, and every vhost it
made is deleted, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import contextlib

import dramatiq
import pika
import pika.exceptions
import redis
from dramatiq.brokers.redis import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_MAINTENANCE_CHANCE,
    RedisBroker,
)

from bench.recovery_keys import ACTOR, MODE_VARIABLE, QUEUE, ready_key, starts_key
from bench.support import RABBITMQ_URL, Vhosts, free_port
from reports.settings import Settings
from reports.worker.broker import Broker, build_broker

REDIS_SERVER = "/usr/bin/redis-server"
#: Environment variables that would change what is measured; the workers get the bench's values.
_SCRUBBED_ENV = (
    "BROKER_URL",
    "REDIS_URL",
    "BROKER_NAMESPACE",
    "HEARTBEAT_TIMEOUT_MS",
    "MAINTENANCE_CHANCE",
    MODE_VARIABLE,
)


class Interrupted(Exception):
    """The bench is shutting down (Ctrl-C or SIGTERM)."""


class RunFailed(Exception):
    """A run could not be measured (a worker did not boot, the message never started, ...)."""


# --------------------------------------------------------------------------- processes


class Processes:
    """Every process group the bench starts, so that all of them can be killed on the way out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: list[subprocess.Popen[bytes]] = []
        self._closed = False

    def start(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._closed:  # a run's thread still going after kill_all: start nothing more
                raise Interrupted()
            process = subprocess.Popen(argv, start_new_session=True, **kwargs)
            self._live.append(process)
            return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the process's whole group (it leads its own session), then reap the leader."""
        with self._lock:
            if process not in self._live:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            self._live.remove(process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def kill_all(self) -> None:
        with self._lock:
            self._closed = True
            live = list(self._live)
        for process in live:
            self.kill(process)


# --------------------------------------------------------------------------- redis


def start_private_redis(processes: Processes, workdir: Path) -> tuple[str, str]:
    """Start a throwaway redis-server on a free loopback port; returns (url, description)."""
    port = free_port()
    log = workdir / "redis-server.log"
    processes.start(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--logfile",
            str(log),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            version = client.info("server")["redis_version"]
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise RunFailed(f"private redis-server did not start; see {log}") from None
            time.sleep(0.05)
    client.close()
    return url, f"private redis-server {version} on 127.0.0.1:{port}"


# --------------------------------------------------------------------------- one run


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    label: str
    #: None: the setting does not apply (RabbitMQ).
    heartbeat_timeout_ms: int | None
    maintenance_chance: int | None
    #: Decimals the runs and the median are printed with.
    decimals: int = 1


@dataclasses.dataclass
class RunResult:
    mode: str
    index: int
    seconds: float | None = None  # None: timed out
    error: str | None = None


@dataclasses.dataclass
class Context:
    processes: Processes
    redis_url: str
    private_redis: bool
    settings: Settings
    logdir: Path
    startup_timeout: float
    timeout: float
    stop: threading.Event
    print_lock: threading.Lock
    #: The vhosts of the RabbitMQ runs (None: no RabbitMQ run).
    vhosts: Vhosts | None = None

    def log(self, text: str) -> None:
        with self.print_lock:
            stamp = datetime.datetime.now().strftime("%H:%M:%S")
            print(f"[{stamp}] {text}", file=sys.stderr, flush=True)


def _worker_env(ctx: Context, mode: Mode, namespace: str, broker_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV and not k.startswith("dramatiq_")}
    env.update(
        {
            MODE_VARIABLE: mode.name,
            "BROKER_URL": broker_url,
            "BROKER_NAMESPACE": namespace,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if mode.name == "rabbitmq":
        env["REDIS_URL"] = ctx.redis_url
    if mode.name == "project":
        env["HEARTBEAT_TIMEOUT_MS"] = str(mode.heartbeat_timeout_ms)
        env["MAINTENANCE_CHANCE"] = str(mode.maintenance_chance)
    return env


def _start_group(ctx: Context, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return ctx.processes.start(
            [sys.executable, "-m", "dramatiq", "bench.recovery_actors", "--processes", "1", "--threads", "1"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _producer(ctx: Context, mode: Mode, namespace: str, broker_url: str) -> Broker:
    """A producer broker with the same settings as the mode's workers."""
    if mode.name == "rabbitmq":
        settings = dataclasses.replace(
            ctx.settings, broker_url=broker_url, redis_url=ctx.redis_url, broker_namespace=namespace
        )
        return build_broker(settings)
    if mode.name == "project":
        settings = dataclasses.replace(
            ctx.settings,
            broker_url=ctx.redis_url,
            broker_namespace=namespace,
            heartbeat_timeout_ms=mode.heartbeat_timeout_ms,
            maintenance_chance=mode.maintenance_chance,
        )
        return build_broker(settings)
    return RedisBroker(url=ctx.redis_url, namespace=namespace)


def _blpop(
    ctx: Context, client: redis.Redis, key: str, deadline: float, groups: list[subprocess.Popen[bytes]]
) -> dict[str, Any] | str | None:
    """Pop one entry from ``key`` before ``deadline`` (time.time()); None on timeout.

    Waits in short blocking pops so that Ctrl-C and dead worker groups are noticed.
    """
    while True:
        _check_running(ctx, groups)
        remaining = deadline - time.time()
        if remaining <= 0:
            return None
        item = client.blpop([key], timeout=min(1.0, max(remaining, 0.01)))
        if item is not None:
            raw = item[1].decode()
            return json.loads(raw) if raw.startswith("{") else raw


def _check_running(ctx: Context, groups: list[subprocess.Popen[bytes]]) -> None:
    """Raise if the run was interrupted or a worker group has exited."""
    if ctx.stop.is_set():
        raise Interrupted()
    for group in groups:
        if group.poll() is not None:
            raise RunFailed(f"worker group {group.pid} exited with {group.returncode}")


def _await_consumers(
    ctx: Context, url: str, queue: str, count: int, deadline: float, groups: list[subprocess.Popen[bytes]]
) -> None:
    """Wait until RabbitMQ counts ``count`` consumers on ``queue``: a worker announces its boot once its
    consumer threads are started, which subscribe a moment later."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        while True:
            _check_running(ctx, groups)
            try:
                if channel.queue_declare(queue, passive=True).method.consumer_count >= count:
                    return
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:  # not declared yet: the broker closes the channel
                    raise
                channel = connection.channel()
            if time.time() > deadline:
                raise RunFailed(f"{queue} has fewer than {count} consumers after {ctx.startup_timeout:.0f} s")
            time.sleep(0.02)
    finally:
        connection.close()


def one_run(ctx: Context, mode: Mode, index: int) -> RunResult:
    result = RunResult(mode.name, index)
    namespace = f"bench-recovery-{mode.name}-{index}-{uuid.uuid4().hex[:8]}"
    token = namespace
    client = redis.Redis.from_url(ctx.redis_url)
    groups: list[subprocess.Popen[bytes]] = []
    vhost: str | None = None
    try:
        if mode.name == "rabbitmq":
            assert ctx.vhosts is not None
            vhost, broker_url = ctx.vhosts.create()
        else:
            broker_url = ctx.redis_url
        env = _worker_env(ctx, mode, namespace, broker_url)
        for name in ("g1", "g2"):
            groups.append(_start_group(ctx, env, ctx.logdir / f"{namespace}.{name}.log"))

        # Both groups booted: each worker process announces itself after its consumers start.
        deadline = time.time() + ctx.startup_timeout
        ready: list[int] = []
        while len(ready) < 2:
            pid = _blpop(ctx, client, ready_key(namespace), deadline, groups)
            if pid is None:
                raise RunFailed(f"worker groups did not boot within {ctx.startup_timeout:.0f} s")
            ready.append(int(pid))
        if mode.name == "rabbitmq":
            _await_consumers(ctx, broker_url, QUEUE, 2, deadline, groups)

        producer = _producer(ctx, mode, namespace, broker_url)
        try:
            producer.enqueue(dramatiq.Message(queue_name=QUEUE, actor_name=ACTOR, args=(token,), kwargs={}, options={}))
        finally:
            producer.close()

        first = _blpop(ctx, client, starts_key(token), time.time() + ctx.startup_timeout, groups)
        if first is None:
            raise RunFailed("the hold message never started")
        holder_group = os.getpgid(int(first["pid"]))
        victims = [g for g in groups if g.pid == holder_group]
        if len(victims) != 1:
            raise RunFailed(f"pid {first['pid']} that started the message is in no worker group")
        victim = victims[0]
        standby = next(g for g in groups if g is not victim)
        # The standby group is idle: one message only, and nothing else has started it.
        if client.llen(starts_key(token)) != 0:
            raise RunFailed("the message started twice before the kill")

        killed_at = time.time()
        ctx.processes.kill(victim)
        groups.remove(victim)

        second = _blpop(ctx, client, starts_key(token), killed_at + ctx.timeout, [standby])
        if second is None:
            result.seconds = None
        else:
            if os.getpgid(int(second["pid"])) != standby.pid:
                raise RunFailed(f"redelivered to pid {second['pid']}, not in the standby group")
            result.seconds = float(second["t"]) - killed_at
    except Interrupted:
        raise
    except RunFailed as exc:
        result.error = str(exc)
    except Exception as exc:  # noqa: BLE001  (report it; do not crash the other runs)
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        for group in groups:
            ctx.processes.kill(group)
        if vhost is not None and ctx.vhosts is not None:
            ctx.vhosts.delete(vhost)
        if not ctx.private_redis:
            _delete_keys(client, namespace, token)
        client.close()
    return result


def _delete_keys(client: redis.Redis, namespace: str, token: str) -> None:
    try:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        keys += [starts_key(token), ready_key(namespace)]
        client.delete(*keys)
    except redis.RedisError:
        pass


# --------------------------------------------------------------------------- report


def median_bound(values: list[float | None], timeout: float) -> tuple[float | None, bool]:
    """The median, with timed-out runs counted as ``timeout``; True when that makes it a lower bound."""
    if not values:
        return None, False
    xs = sorted((v if v is not None else timeout, v is None) for v in values)
    n = len(xs)
    middle = [xs[n // 2]] if n % 2 else [xs[n // 2 - 1], xs[n // 2]]
    return sum(v for v, _ in middle) / len(middle), any(bound for _, bound in middle)


def _fmt_run(result: RunResult, timeout: float, decimals: int = 1) -> str:
    if result.error is not None:
        return "error"
    if result.seconds is None:
        return f">{timeout:.0f}"
    return f"{result.seconds:.{decimals}f}"


def _fmt_median(value: float | None, bound: bool, decimals: int = 1) -> str:
    if value is None:
        return "n/a"
    return f">={value:.{decimals}f}" if bound else f"{value:.{decimals}f}"


def _fmt_setting(value: int | None, text: str) -> str:
    return "n/a" if value is None else text


def _ratio(slow: tuple[float | None, bool], fast: tuple[float | None, bool], slow_name: str, fast_name: str) -> str:
    """``slow``'s median over ``fast``'s, each (median, is a lower bound)."""
    (s, s_bound), (f, f_bound) = slow, fast
    if f is None or s is None or f <= 0:
        return "n/a"
    if f_bound and s_bound:
        return "n/a (both medians are lower bounds)"
    if s_bound:
        return f">= {s / f:.1f}x ({slow_name} median is a lower bound)"
    if f_bound:
        return f"<= {s / f:.1f}x ({fast_name} median is a lower bound)"
    return f"{s / f:.1f}x"


def report(
    ctx: Context,
    modes: list[Mode],
    results: dict[str, list[RunResult]],
    redis_desc: str,
    started: datetime.datetime,
    finished: datetime.datetime,
    rabbitmq_desc: str | None = None,
) -> bool:
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print("kill -9 of a worker's process group -> redelivery of its in-flight message")
    print(
        f"date:    {started:%Y-%m-%d %H:%M:%S} to {finished:%H:%M:%S} ({(finished - started).total_seconds():.0f} s wall)"
    )
    print(f"machine: nproc={nproc}, {platform.machine()}, {platform.system()} {platform.release()}")
    print(
        f"stack:   Python {platform.python_version()}, dramatiq {dramatiq.__version__}, redis-py {redis.__version__}, {redis_desc}"
    )
    if rabbitmq_desc is not None:
        print(f"         {rabbitmq_desc}")
    print("workers: 2 groups per run (python -m dramatiq bench.recovery_actors --processes 1 --threads 1);")
    print(
        f"         the group running the message is SIGKILLed, the other stands by idle; timeout {ctx.timeout:.0f} s per run"
    )
    print()
    rows = [("mode", "heartbeat_timeout", "maintenance_chance", "runs (s, kill -> redelivery)", "median (s)")]
    medians: dict[str, tuple[float | None, bool]] = {}
    failed = False
    for mode in modes:
        runs = sorted(results[mode.name], key=lambda r: r.index)
        measured = [r.seconds for r in runs if r.error is None]
        medians[mode.name] = median_bound(measured, ctx.timeout)
        failed |= any(r.error is not None for r in runs)
        chance = mode.maintenance_chance
        rows.append(
            (
                mode.label,
                _fmt_setting(mode.heartbeat_timeout_ms, f"{mode.heartbeat_timeout_ms} ms"),
                _fmt_setting(chance, f"{chance}/1e6 ({(chance or 0) / 1e4:g}%)"),
                "  ".join(_fmt_run(r, ctx.timeout, mode.decimals) for r in runs),
                _fmt_median(*medians[mode.name], mode.decimals),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    none = (None, False)
    ratio = _ratio(medians.get("defaults", none), medians.get("project", none), "defaults", "project")
    print(f"ratio defaults/project (medians): {ratio}")
    if "rabbitmq" in medians:
        ratio = _ratio(medians.get("project", none), medians["rabbitmq"], "project", "rabbitmq")
        print(f"ratio project/rabbitmq (medians): {ratio}")
    if failed:
        print()
        for mode in modes:
            for r in sorted(results[mode.name], key=lambda r: r.index):
                if r.error is not None:
                    print(f"error: {mode.label} run {r.index + 1}: {r.error}")
        print(f"worker logs kept in {ctx.logdir}")
    sys.stdout.flush()
    return failed


# --------------------------------------------------------------------------- main


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs with the project's settings (default 5)")
    parser.add_argument(
        "--default-runs", type=int, default=3, help="runs with Dramatiq's defaults, all at once (default 3)"
    )
    parser.add_argument(
        "--rabbitmq-runs",
        type=int,
        default=5,
        help="runs on RabbitMQ, workers built like the real ones; 0 leaves RabbitMQ out (default 5)",
    )
    parser.add_argument(
        "--rabbitmq-url",
        default=RABBITMQ_URL,
        help="the RabbitMQ node (this machine's, which rabbitmqctl manages) each run makes a vhost on"
        " (default BENCH_RABBITMQ_URL or amqp://guest:guest@127.0.0.1:5672/)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1200.0,
        help="seconds after the kill before a run is reported as '> timeout' (default 1200)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=60.0,
        help="seconds for the workers to boot and start the message (default 60)",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="use this Redis instead of a private redis-server (keys are deleted afterwards)",
    )
    args = parser.parse_args(argv)
    if (
        min(args.runs, args.default_runs, args.rabbitmq_runs) < 0
        or args.runs + args.default_runs + args.rabbitmq_runs == 0
    ):
        parser.error("nothing to run")
    vhosts, rabbitmq_desc = None, None
    if args.rabbitmq_runs:
        vhosts = Vhosts(args.rabbitmq_url)
        try:
            rabbitmq_version = vhosts.check()
        except RuntimeError as exc:
            parser.error(f"{exc} (--rabbitmq-runs 0 leaves RabbitMQ out)")
        host = urllib.parse.urlsplit(args.rabbitmq_url)
        rabbitmq_desc = (
            f"RabbitMQ {rabbitmq_version} on {host.hostname}:{host.port or 5672} (a vhost of each run's own),"
            f" pika {pika.__version__}"
        )

    signal.signal(signal.SIGTERM, _raise_interrupt)
    settings = Settings.from_env()
    modes = []
    if args.runs:
        modes.append(Mode("project", "project settings", settings.heartbeat_timeout_ms, settings.maintenance_chance))
    if args.default_runs:
        modes.append(Mode("defaults", "dramatiq defaults", DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_MAINTENANCE_CHANCE))
    if args.rabbitmq_runs:
        modes.append(Mode("rabbitmq", "project on RabbitMQ", None, None, decimals=3))
    counts = {"project": args.runs, "defaults": args.default_runs, "rabbitmq": args.rabbitmq_runs}

    processes = Processes()
    workdir = Path(tempfile.mkdtemp(prefix="recovery-bench-"))
    stop = threading.Event()
    results: dict[str, list[RunResult]] = {m.name: [] for m in modes}
    keep_logs = False
    try:
        if args.redis_url:
            redis_url, redis_desc = args.redis_url, f"Redis at {args.redis_url}"
        else:
            redis_url, redis_desc = start_private_redis(processes, workdir)
        ctx = Context(
            processes,
            redis_url,
            not args.redis_url,
            settings,
            workdir,
            args.startup_timeout,
            args.timeout,
            stop,
            threading.Lock(),
            vhosts,
        )
        started = datetime.datetime.now()
        ctx.log(f"redis: {redis_desc}; logs in {workdir}")
        if rabbitmq_desc is not None:
            ctx.log(f"rabbitmq: {rabbitmq_desc}")

        def record(mode: Mode, index: int) -> None:
            try:
                result = one_run(ctx, mode, index)
            except Interrupted:
                return
            results[mode.name].append(result)
            outcome = result.error or _fmt_run(result, ctx.timeout, mode.decimals) + " s"
            ctx.log(f"{mode.label} run {index + 1}/{counts[mode.name]}: {outcome}")

        def sequential(mode: Mode) -> None:
            for index in range(counts[mode.name]):
                if stop.is_set():
                    return
                record(mode, index)

        threads = []
        for mode in modes:
            if mode.name == "defaults":
                # Minutes each, waiting on a random draw: run them all at once.
                threads += [
                    threading.Thread(target=record, args=(mode, i), daemon=True) for i in range(counts["defaults"])
                ]
            else:
                threads.append(threading.Thread(target=sequential, args=(mode,), daemon=True))
        for thread in threads:
            thread.start()
            time.sleep(0.5)  # stagger the worker boots a little on small machines
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
        finished = datetime.datetime.now()
        keep_logs = report(ctx, modes, results, redis_desc, started, finished, rabbitmq_desc)
        return 1 if keep_logs else 0
    except KeyboardInterrupt:
        print("interrupted: killing every process the bench started", file=sys.stderr, flush=True)
        return 130
    finally:
        # A second Ctrl-C (or SIGTERM) must not cut the clean-up short: it would leave processes and vhosts.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop.set()
        processes.kill_all()
        if vhosts is not None:
            vhosts.delete_all()
        if not keep_logs:  # kept only when a run failed, for its worker logs
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
