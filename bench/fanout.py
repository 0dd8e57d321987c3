"""Fan-out: how fast the coordinator walks and enqueues, on Redis and on RabbitMQ, and what the broker holds.

Usage: python bench/fanout.py [--broker redis|rabbitmq|sqs|both] [--repeats 3] [--users 1000000]
                              [--loop-messages 20000] [--high-water 100000] [--drain-rate 8000]
                              [--pause-seconds 1] [--rabbitmq-url amqp://guest:guest@127.0.0.1:5672/]

On a PostgreSQL database of its own (TEST_POSTGRES_URL's server), a private redis-server and, for
RabbitMQ, a vhost ``bench-<hex>`` of its own on this machine's node (made with rabbitmqctl, deleted
after, Ctrl-C included; REDIS_URL is the private redis-server), for each broker of ``--broker``
(default both):
1. the coordinator (reports.fanout.coordinator.walk_slice, batched inserts, then the queue's ``send_jobs``: on
   Redis a pipelined MULTI per page, on RabbitMQ ``publish_confirmed``, one wait for a page's
   publisher confirms) walks every user with no high-water mark, ``--repeats`` times, each on an
   empty items table and an empty queue; messages/s (one message per user); checks that the queue
   then holds exactly one message per user (Redis: the queue's list and hash; RabbitMQ:
   reports.worker.rabbitmq.ready_counts) and prints what the broker's memory grew by per queued
   message (Redis: used_memory; RabbitMQ: the queue's memory as ``rabbitmqctl list_queues`` tells);
2. a loop of ``broker.enqueue`` (what ``actor.send`` does; on RabbitMQ one publisher confirm per
   message) for --loop-messages, ``--repeats`` times: msg/s, and the ratio;
3. the whole walk again on a fresh period with the high-water mark, while a stand-in for the
   workers takes messages off the queue at --drain-rate a second (Redis: LPOP and HDEL on the
   queue's keys; RabbitMQ: a consumer with a prefetch of one tick's share, acking a tick's share at
   a time): the walk pauses when the backlog reaches the mark, looks again after --pause-seconds
   (the actor re-enqueues itself with PLAN_PAUSE_SECONDS), and goes on; the backlog the walk sees
   is sampled every 0.1 s and its peak printed, and so is Redis's peak used_memory.
Then one table: each broker's messages/s (median of its repeats, each repeat's figure after it)
and the ratio of the two.

``--broker sqs`` (not in ``both``) runs the same phases on moto's SQS server (tests/support/sqs.py),
started in this process on a loopback port: fresh queues for each phase (SQS purges a queue once a
minute at most), a stand-in for the workers that receives and deletes in batch calls of ten, and
no memory figure.
Its figures are moto's speed, not SQS's, and have no target; it also prints the SQS requests each
phase made per message. Run it with far fewer users than the default (``--users 20000``).

The brokers' repeats alternate (Redis, RabbitMQ, Redis, ...), so that whatever else the machine
does falls on both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import pika
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from sqlalchemy.orm import Session, sessionmaker
from support import RABBITMQ_URL, Vhosts, interrupt_on_sigterm, pg_connect, redis_server, temporary_database

from reports.database import create_db_engine, session_factory, upgrade
from reports.fanout import coordinator, runs
from reports.jobs import BUILD_REPORT
from reports.periods import Period
from reports.settings import Settings
from reports.worker.broker import Broker, build_broker, message_for
from reports.worker.queues import queue_for
from reports.worker.rabbitmq import ready_counts
from tests.support import sqs as moto

BROKERS = ("redis", "rabbitmq", "sqs")
QUEUE = BUILD_REPORT.queue


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


@contextlib.contextmanager
def every(seconds: float, step: Callable[[], None]) -> Iterator[None]:
    """Run ``step`` every ``seconds`` in a thread while the block runs, and once more at its end."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        step()


TICK = 0.05


class Drain(Protocol):
    """A stand-in for the worker fleet: takes ``rate`` messages a second off the bulk queue, a
    slice at each :meth:`step` (every ``TICK`` seconds)."""

    taken: int

    def step(self) -> None: ...

    def close(self) -> None: ...


class RedisDrain:
    """Ids from the queue's list, bodies from its hash."""

    def __init__(self, settings: Settings, *, rate: int) -> None:
        self.client = redis.Redis.from_url(settings.broker_url)
        self.queue = f"{settings.broker_namespace}:{QUEUE}"
        self.rate = rate
        self.taken = 0

    def step(self) -> None:
        ids = self.client.lpop(self.queue, int(self.rate * TICK)) or []
        if ids:
            self.client.hdel(f"{self.queue}.msgs", *ids)
            self.taken += len(ids)

    def close(self) -> None:
        self.client.close()


class RabbitmqDrain:
    """A consumer on a connection of its own, prefetching one tick's share; each step acks (in one
    ``basic_ack`` with ``multiple``) up to a tick's share of what was delivered, so RabbitMQ holds
    back the rest as it would for a worker with a full prefetch."""

    def __init__(self, settings: Settings, *, rate: int) -> None:
        self.share = max(1, int(rate * TICK))
        self.connection = pika.BlockingConnection(pika.URLParameters(settings.broker_url))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=self.share)
        self.delivered: list[int] = []
        self.channel.basic_consume(QUEUE, self._on_message, auto_ack=False)
        self.taken = 0

    def _on_message(self, _channel: Any, method: Any, _properties: Any, _body: bytes) -> None:
        self.delivered.append(method.delivery_tag)

    def step(self) -> None:
        self.connection.process_data_events(time_limit=0)
        n = min(self.share, len(self.delivered))
        if n:
            self.channel.basic_ack(self.delivered[n - 1], multiple=True)
            del self.delivered[:n]
            self.taken += n

    def close(self) -> None:
        with contextlib.suppress(pika.exceptions.AMQPError):
            self.connection.close()


class SqsDrain:
    """Receives and deletes up to a tick's share at each step, in batch calls of ten."""

    def __init__(self, broker: Any, *, rate: int) -> None:
        self.client, self.url = broker.client, broker.url_of(QUEUE)
        self.share = max(1, int(rate * TICK))
        self.taken = 0

    def step(self) -> None:
        taken = 0
        while taken < self.share:
            batch = min(10, self.share - taken)
            received = self.client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=batch).get("Messages", [])
            if not received:
                break
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(received)]
            self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
            taken += len(received)
        self.taken += taken

    def close(self) -> None:
        pass


@dataclass
class Target:
    """One broker under test, with what the bench reads and empties on it."""

    name: str
    settings: Settings
    broker: Broker
    #: Redis: the private server's client; None on RabbitMQ.
    client: redis.Redis | None
    #: RabbitMQ: the vhost's name (for rabbitmqctl); None on Redis.
    vhost: str | None = None
    #: SQS (moto): the requests its server answered, by action; None on the others.
    requests: Counter[str] | None = None
    walks: list[float] = field(default_factory=list)
    loops: list[float] = field(default_factory=list)
    bytes_per_message: list[float] = field(default_factory=list)
    seconds_per_page: list[float] = field(default_factory=list)

    def empty(self) -> None:
        """An empty broker: Redis flushed; on RabbitMQ the queue and its .DQ and .XQ deleted and declared
        afresh, so that a queue's memory starts from nothing each time (a purge leaves the queue's
        process as large as it grew)."""
        if self.client is not None:
            self.client.flushall()
            return
        if self.requests is not None:
            # SQS purges a queue once a minute at most: fresh queues, under a prefix of their own.
            self.broker.close()
            self.settings = replace(self.settings, broker_url=_sqs_url(self.settings.broker_url))
            self.broker = build_broker(self.settings)
            return
        assert isinstance(self.broker, RabbitmqBroker)
        for name in (QUEUE, f"{QUEUE}.DQ", f"{QUEUE}.XQ"):
            self.broker.channel.queue_delete(name)
        # Dramatiq declares a queue once per broker; mark it undeclared (Dramatiq is pinned).
        self.broker.queues_pending.add(QUEUE)
        self.broker.declare_queue(QUEUE, ensure=True)

    def memory(self) -> int | None:
        """Bytes: Redis used_memory; RabbitMQ the bulk queue's memory (rabbitmqctl list_queues); None on SQS."""
        if self.client is not None:
            return _used_memory(self.client)
        if self.requests is not None:
            return None
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "-p", str(self.vhost), "name", "memory", "--formatter", "json"],
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout
        return next(int(q["memory"]) for q in json.loads(out) if q["name"] == QUEUE)

    def check_queued(self, expected: int) -> None:
        """Raise unless the queue holds exactly ``expected`` ready messages and nothing else."""
        if self.client is not None:
            assert isinstance(self.broker, RedisBroker)
            key = f"{self.broker.namespace}:{QUEUE}"
            with self.client.pipeline(transaction=False) as pipe:
                pipe.llen(key).hlen(f"{key}.msgs").llen(f"{key}.DQ")
                ids, bodies, delayed = pipe.execute()
            found = f"{ids:,} ids on {key}, {bodies:,} bodies in {key}.msgs, {delayed:,} on {key}.DQ"
            ok = ids == bodies == expected and delayed == 0
        elif self.requests is not None:
            ready, delayed, in_flight, dead = moto.queue_depths(self.settings.broker_url, QUEUE)
            found = f"{ready:,} ready, {delayed:,} delayed, {in_flight:,} in flight, {dead:,} dead"
            ok = ready == expected and delayed == in_flight == dead == 0
        else:
            assert isinstance(self.broker, RabbitmqBroker)
            ready, delayed, dead = ready_counts(self.broker, QUEUE)
            found = f"{ready:,} ready on {QUEUE}, {delayed:,} on {QUEUE}.DQ, {dead:,} on {QUEUE}.XQ"
            ok = ready == expected and delayed == dead == 0
        if not ok:
            raise RuntimeError(f"{self.name}: expected {expected:,} messages queued, found {found}")

    def drain(self, rate: int) -> Drain:
        if self.client is not None:
            return RedisDrain(self.settings, rate=rate)
        if self.requests is not None:
            return SqsDrain(self.broker, rate=rate)
        return RabbitmqDrain(self.settings, rate=rate)


class Peak:
    """The highest value ``read()`` gave at any :meth:`step`."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read
        self.value = read()

    def step(self) -> None:
        self.value = max(self.value, self.read())


def _empty_items(database_url: str) -> None:
    """No run and no item: each walk starts as the first one would."""
    with pg_connect(database_url) as connection:
        connection.execute("TRUNCATE report_items, item_counts, period_runs CASCADE")


def walk(target: Target, sessions: sessionmaker[Session], database_url: str, users: int, page_size: int) -> str:
    """Phase 1 once on ``target``: the whole walk with no high-water mark; a line to print."""
    _empty_items(database_url)
    target.empty()
    period = Period(2026, 10)
    with sessions.begin() as session:
        runs.trigger(session, period, template_version="v1", now=datetime.now())
    before = target.memory()
    requests = Counter(target.requests)
    started = time.perf_counter()
    outcome = coordinator.SliceOutcome()
    while not outcome.planned:
        outcome = coordinator.walk_slice(
            sessions, period, queue_for(target.broker), page_size=page_size, budget_seconds=3600
        )
    planned_s = time.perf_counter() - started
    made = Counter(target.requests) - requests
    target.check_queued(users)
    after = target.memory()
    rate = users / planned_s
    per_page = planned_s / max(1, -(-users // page_size))
    target.walks.append(rate)
    target.seconds_per_page.append(per_page)
    line = (
        f"coordinator: planned and enqueued {users:,} users in {planned_s:.1f} s = {rate:,.0f} users/s "
        f"({per_page * 1000:.0f} ms a page of {page_size}); {users:,} messages queued"
    )
    if after is None or before is None:
        return f"{line}; SQS requests per message: {_per_message(made, users)}"
    used = after - before
    target.bytes_per_message.append(used / users)
    what = "used_memory" if target.client is not None else "queue memory"
    return f"{line}, {what} +{used / 1e6:.1f} MB = {used / users:.0f} bytes/message"


def _sqs_url(broker_url: str) -> str:
    """``broker_url`` with a new queue-name prefix ``bench-<12 hex>``."""
    endpoint = broker_url.partition("?")[2]
    return f"sqs://{moto.REGION}/bench-{uuid.uuid4().hex[:12]}?{endpoint}"


def _per_message(requests: Counter[str], messages: int) -> str:
    return ", ".join(f"{action} {n / messages:.3f}" for action, n in requests.most_common()) or "none"


def loop(target: Target, messages: int) -> str:
    """Phase 2 once on ``target``: single enqueues; a line to print."""
    target.empty()
    payload = {"period": "2026-10", "user_id": 1, "template_version": "v1"}
    requests = Counter(target.requests)
    started = time.perf_counter()
    for _ in range(messages):
        target.broker.enqueue(message_for(BUILD_REPORT, payload))
    rate = messages / (time.perf_counter() - started)
    made = Counter(target.requests) - requests
    target.check_queued(messages)
    target.loops.append(rate)
    per_message = f"; SQS requests per message: {_per_message(made, messages)}" if target.requests is not None else ""
    return f"loop of broker.enqueue: {rate:,.0f} msg/s{per_message}"


def high_water(target: Target, sessions: sessionmaker[Session], database_url: str, args: argparse.Namespace) -> str:
    """Phase 3 on ``target``: the walk with the high-water mark, drained as workers would."""
    _empty_items(database_url)
    target.empty()
    second = Period(2026, 9)
    with sessions.begin() as session:
        runs.trigger(session, second, template_version="v1", now=datetime.now())
    base = target.memory() if target.client is not None else None
    drain = target.drain(args.drain_rate)
    # The sampler has a broker connection of its own: Dramatiq's RabbitMQ broker keeps one per thread.
    peak_backlog = Peak(lambda: queue_for(target.broker).backlog(QUEUE))
    client = target.client
    peak_memory = Peak(lambda: _used_memory(client)) if client is not None else None
    try:
        with (
            every(TICK, drain.step),
            every(0.1, peak_backlog.step),
            every(0.1, peak_memory.step) if peak_memory is not None else contextlib.nullcontext(),
        ):
            started = time.perf_counter()
            pauses = 0
            outcome = coordinator.SliceOutcome()
            while not outcome.planned:
                outcome = coordinator.walk_slice(
                    sessions,
                    second,
                    queue_for(target.broker),
                    page_size=args.page_size,
                    budget_seconds=3600,
                    high_water=args.high_water,
                )
                if outcome.backlogged:
                    pauses += 1
                    time.sleep(args.pause_seconds)
            walked_s = time.perf_counter() - started
    finally:
        drain.close()
    memory = (
        f"; peak used_memory {peak_memory.value / 1e6:.1f} MB (empty: {base / 1e6:.1f} MB)"
        if peak_memory is not None and base is not None
        else ""
    )
    return (
        f"with high water {args.high_water:,} and workers taking {args.drain_rate:,} msg/s: walked "
        f"{args.users:,} users in {walked_s:.0f} s, {pauses} pauses, {drain.taken:,} messages taken; "
        f"peak backlog {peak_backlog.value:,}{memory}"
    )


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def table(targets: list[Target], repeats: int) -> None:
    """Each broker's median msg/s (and each repeat's), and RabbitMQ's over Redis's when both ran."""
    print()
    print(f"fan-out, messages/s: median of {repeats} repeat(s), each repeat's figure in brackets")
    header = ["measure"]
    for t in targets:
        header += [t.name, f"{t.name} repeats"]
    both = len(targets) == 2
    if both:
        header.append(f"{targets[1].name}/{targets[0].name}")
    rows = [header]

    def row(label: str, values: Callable[[Target], list[float]], fmt: Callable[[float], str]) -> None:
        cells, medians = [label], []
        for t in targets:
            xs = values(t)
            medians.append(statistics.median(xs) if xs else None)
            cells += ["n/a" if medians[-1] is None else fmt(medians[-1]), "[" + " ".join(fmt(x) for x in xs) + "]"]
        if both:
            a, b = medians
            cells.append(f"{b / a:.2f}x" if a and b is not None else "n/a")
        rows.append(cells)

    row("coordinator walk (send_jobs)", lambda t: t.walks, _fmt_rate)
    row("loop of broker.enqueue", lambda t: t.loops, _fmt_rate)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, cells in enumerate(rows):
        print(
            "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths, strict=True)))
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for t in targets:
        walk_m = statistics.median(t.walks) if t.walks else None
        loop_m = statistics.median(t.loops) if t.loops else None
        ratio = f"{walk_m / loop_m:.1f}x" if walk_m and loop_m else "n/a"
        extra = ""
        if t.seconds_per_page:
            memory = (
                f", {statistics.median(t.bytes_per_message):.0f} bytes/message "
                f"({'used_memory' if t.client is not None else 'queue memory'})"
                if t.bytes_per_message
                else ""
            )
            extra = f"; {statistics.median(t.seconds_per_page) * 1000:.0f} ms a page{memory}, medians"
        print(f"{t.name}: coordinator / loop (medians) = {ratio}{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=(*BROKERS, "both"), default="both", help="both: redis and rabbitmq")
    parser.add_argument("--repeats", type=int, default=3, help="walks and loops per broker (default 3)")
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--loop-messages", type=int, default=20_000)
    parser.add_argument("--high-water", type=int, default=100_000)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--drain-rate", type=int, default=8000, help="messages/s the stand-in workers take")
    parser.add_argument("--pause-seconds", type=float, default=1.0)
    parser.add_argument(
        "--skip-high-water", action="store_true", help="leave out phase 3 (the walk with the high-water mark)"
    )
    parser.add_argument(
        "--rabbitmq-url",
        default=RABBITMQ_URL,
        help="this machine's RabbitMQ node, which the bench makes its vhost on (default BENCH_RABBITMQ_URL or "
        "amqp://guest:guest@127.0.0.1:5672/)",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    names = BROKERS[:2] if args.broker == "both" else (args.broker,)
    interrupt_on_sigterm()

    vhosts = Vhosts(args.rabbitmq_url) if "rabbitmq" in names else None
    rabbitmq_version = None
    if vhosts is not None:
        try:
            rabbitmq_version = vhosts.check()
        except RuntimeError as error:
            parser.error(f"{error} (--broker redis leaves RabbitMQ out)")

    targets: list[Target] = []
    engine = None
    requests: Counter[str] = Counter()
    try:
        with (
            redis_server() as redis_url,
            temporary_database() as url,
            moto.moto_server(requests) if "sqs" in names else contextlib.nullcontext("") as endpoint,
        ):
            upgrade(Settings(database_url=url, broker_url=redis_url))
            with pg_connect(url) as connection:
                connection.execute(
                    "INSERT INTO users (id, email, name, active) "
                    "SELECT g, 'user' || g || '@example.test', 'User ' || g, true FROM generate_series(1, %s) g",
                    (args.users,),
                )
                connection.execute("VACUUM ANALYZE users")
            engine = create_db_engine(url)
            sessions = session_factory(engine)
            for name in names:
                if name == "redis":
                    settings = Settings(database_url=url, broker_url=redis_url, broker_namespace="bench")
                    targets.append(
                        Target(name, settings, build_broker(settings), redis.Redis.from_url(settings.broker_url))
                    )
                elif name == "sqs":
                    os.environ.update(moto.CREDENTIALS)
                    settings = Settings(
                        database_url=url,
                        broker_url=_sqs_url(f"?endpoint_url={endpoint}"),
                        redis_url=redis_url,
                        broker_namespace="bench",
                    )
                    targets.append(Target(name, settings, build_broker(settings), None, requests=requests))
                else:
                    assert vhosts is not None
                    vhost, vhost_url = vhosts.create()
                    settings = Settings(
                        database_url=url, broker_url=vhost_url, redis_url=redis_url, broker_namespace="bench"
                    )
                    targets.append(Target(name, settings, build_broker(settings), None, vhost=unquote(vhost)))
            brokers = ", ".join(
                f"redis-server at {urlsplit(redis_url).netloc}"
                if t.client is not None
                else f"moto's SQS at {endpoint} (no target: moto is not SQS's speed)"
                if t.requests is not None
                else f"RabbitMQ {rabbitmq_version} vhost {t.vhost}"
                for t in targets
            )
            print(
                f"{args.users:,} users; page size {args.page_size}; {args.repeats} repeat(s); {brokers}; "
                f"nproc {os.cpu_count()}; {datetime.now():%Y-%m-%d %H:%M}",
                flush=True,
            )

            # 1. The coordinator, no high-water mark; 2. a loop of single enqueues (what actor.send
            # does). The brokers take turns.
            for repeat in range(args.repeats):
                for t in targets:
                    print(
                        f"[{t.name} {repeat + 1}/{args.repeats}] {walk(t, sessions, url, args.users, args.page_size)}"
                    )
            for repeat in range(args.repeats):
                for t in targets:
                    print(f"[{t.name} {repeat + 1}/{args.repeats}] {loop(t, args.loop_messages)}", flush=True)

            # 3. The whole walk with the high-water mark, drained as workers would: the backlog stays bounded.
            if not args.skip_high_water:
                for t in targets:
                    print(f"[{t.name}] {high_water(t, sessions, url, args)}", flush=True)
            table(targets, args.repeats)
    finally:
        for t in targets:
            with contextlib.suppress(Exception):
                t.broker.close()
        if engine is not None:
            engine.dispose()
        if vhosts is not None:
            vhosts.delete_all()


if __name__ == "__main__":
    main()
