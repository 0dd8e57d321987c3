"""CPU per report of ``pipeline.run`` in-process, split by stage, against the floor of its inherent work.

    python bench/per_report.py [--users 2000] [--repeats 3] [--smtp]

On a PostgreSQL database of its own (seeded as ``reports seed`` does) and a private redis-server
holding the mail breaker, it walks a period and runs ``pipeline.run`` once per active user in a
loop, with a mailer that builds the message's bytes and sends them nowhere; with ``--smtp``, with
the workers' SMTP client sending them to a local sink in a process of its own (bench/smtp_sink.py),
as a worker does. It prints:

* CPU per report (``time.process_time``, median over ``--repeats`` passes, a fresh period each),
  split into render, email (composing the message and its bytes), and the rest: the database
  path and the pipeline's own logic, with the time spent inside the driver's ``execute`` shown
  apart;
* statements, transactions and Redis round trips per report;
* the floor: the inherent work alone, one round trip that reads the user and the summary, the
  render, the bytes, one write, and ``pipeline.run``'s ratio to it.

The target: pipeline.run at most 3.0 ms CPU per report, within 1.5x of the floor. The latest
figures and what bounds them: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import redis
from smtp_sink import SmtpSink  # bench/smtp_sink.py, beside this script
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker
from support import in_autocommit, redis_server, seed_users, temporary_database  # bench/support.py, beside this script

from reports import tokens
from reports.content.activity import summarize
from reports.content.render import render
from reports.database import create_db_engine, session_factory, upgrade
from reports.delivery import pipeline
from reports.delivery.breaker import CircuitBreaker, mail_breaker_name
from reports.delivery.mail.backend import Mailer, build_mailer
from reports.delivery.mail.compose import compose, message_id, recipient
from reports.fanout import runs
from reports.fanout.coordinator import walk_slice
from reports.jobs import ReportJob
from reports.periods import Period, previous_month
from reports.queue import InMemoryQueue
from reports.settings import Settings

#: The targets: CPU per report, and the ratio to the floor.
TARGET_MS = 3.0
TARGET_RATIO = 1.5


@dataclass
class Meter:
    """CPU seconds accumulated by each wrapped stage, and what the database and Redis were asked."""

    cpu: dict[str, float] = field(default_factory=dict)
    statements: int = 0
    transactions: int = 0
    driver_cpu: float = 0.0
    _started: float = 0.0

    def add(self, stage: str, seconds: float) -> None:
        self.cpu[stage] = self.cpu.get(stage, 0.0) + seconds

    def timed(self, stage: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(stage, time.process_time() - started)

        return wrapper

    @contextmanager
    def watching(self, engine: Engine) -> Iterator[None]:
        def before(connection: Any, *_args: Any) -> None:
            self.statements += 1
            if in_autocommit(connection):
                self.transactions += 1  # a transaction by itself
            self._started = time.process_time()

        def after(*_args: Any) -> None:
            self.driver_cpu += time.process_time() - self._started

        def commit(connection: Any) -> None:
            if not in_autocommit(connection):
                self.transactions += 1

        listeners = {"before_cursor_execute": before, "after_cursor_execute": after, "commit": commit}
        for name, listener in listeners.items():
            event.listen(engine, name, listener)
        try:
            yield
        finally:
            for name, listener in listeners.items():
                event.remove(engine, name, listener)


class BytesMailer:
    """Takes the message's bytes, which compose built (timed as email), and sends them nowhere."""

    def send(self, message: bytes, *, recipient: str) -> None:
        assert message.endswith(b"\r\n")


@contextmanager
def wrapped(meter: Meter) -> Iterator[None]:
    """Time the pipeline's render and compose where the pipeline calls them (a bench, not a test)."""
    originals = {name: getattr(pipeline, name) for name in ("render", "compose")}
    pipeline.render = meter.timed("render", originals["render"])  # type: ignore[attr-defined]
    pipeline.compose = meter.timed("email", originals["compose"])  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(pipeline, name, original)


def fresh_period(sessions: sessionmaker[Session], period: Period, settings: Settings) -> None:
    with sessions.begin() as session:
        for table in ("item_counts", "report_items", "deliveries", "reports", "period_runs"):
            session.execute(text(f"DELETE FROM {table}"))
        runs.trigger(session, period, template_version=settings.template_version, now=datetime.now(UTC))
    assert walk_slice(sessions, period, InMemoryQueue(), page_size=1000, budget_seconds=600).planned


def one_pass(
    settings: Settings, engine: Engine, redis_url: str, period: Period, users: list[int], mailer: Mailer
) -> dict[str, Any]:
    sessions = session_factory(engine)
    fresh_period(sessions, period, settings)
    meter = Meter()
    client = redis.Redis.from_url(redis_url)
    breaker = CircuitBreaker(
        client,
        name=mail_breaker_name(f"bench-{uuid.uuid4().hex[:8]}"),
        failure_threshold=5,
        window_ms=30_000,
        cooldown_ms=30_000,
        probe_timeout_ms=30_000,
    )
    context = pipeline.Context(settings=settings, sessions=sessions, mailer=mailer, breaker=breaker)
    calls_before = redis_calls(client)
    with wrapped(meter), meter.watching(engine):
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        for user_id in users:
            assert (
                pipeline.run(context, ReportJob(period, user_id, settings.template_version))
                is pipeline.Outcome.DELIVERED
            )
        cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started_wall
    redis_round_trips = redis_calls(client) - calls_before - 1  # the INFO call itself
    n = len(users)
    return {
        "cpu_ms": 1000 * cpu / n,
        "wall_ms": 1000 * wall / n,
        "render_ms": 1000 * meter.cpu.get("render", 0.0) / n,
        "email_ms": 1000 * meter.cpu.get("email", 0.0) / n,
        "driver_ms": 1000 * meter.driver_cpu / n,
        "statements": meter.statements / n,
        "transactions": meter.transactions / n,
        "redis": redis_round_trips / n,
    }


def redis_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(entry["calls"]) for entry in stats.values())


#: The inherent reads of a report in one statement: the user and their two months, grouped.
FLOOR_READ = text("""
    SELECT u.email, u.name, a.occurred_at >= :start AS in_period, a.category, count(a.id),
           coalesce(sum(a.amount_cents), 0)
    FROM users u LEFT JOIN activities a
      ON a.user_id = u.id AND a.occurred_at >= :previous AND a.occurred_at < :end
    WHERE u.id = :user_id
    GROUP BY u.email, u.name, in_period, a.category
""")
FLOOR_WRITE = text("""
    INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at)
    VALUES (:period, :user_id, :version, :subject, :text, :html, :now)
    ON CONFLICT (period, user_id) DO UPDATE SET body_html = excluded.body_html
""")


def floor_pass(settings: Settings, engine: Engine, period: Period, users: list[int]) -> float:
    """CPU ms per report of only the inherent work: read, render, bytes, write.

    The email is the one the contract asks for, so it carries the user's signed unsubscribe link.
    """
    bounds = {"start": period.start, "previous": period.previous().start, "end": period.end}
    links = tokens.links(settings)
    started = time.process_time()
    for user_id in users:
        with engine.begin() as connection:
            rows = connection.execute(FLOOR_READ, {**bounds, "user_id": user_id}).all()
            email, name = rows[0][0], rows[0][1]
            summary = summarize(period, ((bool(r[2]), r[3], r[4], r[5]) for r in rows if r[3] is not None))
            unsubscribe_url = links.url(user_id)
            rendered = render(
                settings.templates_dir,
                settings.template_version,
                name=name,
                summary=summary,
                unsubscribe_url=unsubscribe_url,
            )
            now = datetime.now(UTC).replace(tzinfo=None)
            compose(
                rendered,
                to=recipient(email, name),
                mail_from=settings.mail_from,
                period=period,
                user_id=user_id,
                date=now,
                message_id=message_id(period, user_id, settings.mail_domain),
                unsubscribe_url=unsubscribe_url,
            )
            connection.execute(
                FLOOR_WRITE,
                {
                    "period": str(period),
                    "user_id": user_id,
                    "version": settings.template_version,
                    "subject": rendered.subject,
                    "text": rendered.text,
                    "html": rendered.html,
                    "now": now,
                },
            )
    return 1000 * (time.process_time() - started) / len(users)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--smtp",
        action="store_true",
        help="send each report with the workers' SMTP client to a local sink (a process of its own) instead of nowhere",
    )
    args = parser.parse_args()
    period = previous_month(datetime.now(UTC))
    with ExitStack() as stack:
        url, redis_url = stack.enter_context(temporary_database()), stack.enter_context(redis_server())
        settings = Settings(database_url=url, broker_url=redis_url, mail_from="Reports <reports@bench.test>")
        mailer: Mailer = BytesMailer()
        if args.smtp:
            mailer = build_mailer(replace(settings, smtp_url=stack.enter_context(SmtpSink()).url))
        upgrade(settings)
        users = sorted(seed_users(url, users=args.users, period=period))
        engine = create_db_engine(url)
        try:
            one_pass(settings, engine, redis_url, period, users[:200], mailer)  # warm caches, pools and plans
            passes = [one_pass(settings, engine, redis_url, period, users, mailer) for _ in range(args.repeats)]
            # The floor sends nowhere: against a loop that sends, it would not be the same work.
            floors = [] if args.smtp else [floor_pass(settings, engine, period, users) for _ in range(args.repeats)]
        finally:
            engine.dispose()
    median = {key: statistics.median(p[key] for p in passes) for key in passes[0]}
    rest = median["cpu_ms"] - median["render_ms"] - median["email_ms"]
    sent = "over SMTP to a local sink" if args.smtp else "nowhere"
    print(f"pipeline.run, {len(users):,} reports x {args.repeats} passes on PostgreSQL, sent {sent} (medians):")
    target = "" if args.smtp else f"   target <= {TARGET_MS}"
    print(f"  CPU per report      {median['cpu_ms']:6.2f} ms   (wall {median['wall_ms']:.2f} ms){target}")
    print(f"    render            {median['render_ms']:6.2f} ms")
    print(f"    email             {median['email_ms']:6.2f} ms   (compose + bytes)")
    what = "db + send + rest" if args.smtp else "database + rest"
    print(f"    {what:<17} {rest:6.2f} ms   (of which in the driver's execute: {median['driver_ms']:.2f} ms)")
    print(f"  statements          {median['statements']:6.2f} per report, in {median['transactions']:.2f} transactions")
    print(f"  Redis round trips   {median['redis']:6.2f} per report")
    if args.smtp:
        print("the floor and the targets are for a loop that sends nowhere (without --smtp)")
        return 0
    floor = statistics.median(floors)
    print(f"  floor               {floor:6.2f} ms   (one read, render, bytes, one write)")
    ratio = median["cpu_ms"] / floor
    print(f"  pipeline / floor    {ratio:6.2f}x       target <= {TARGET_RATIO}x")
    met = median["cpu_ms"] <= TARGET_MS and ratio <= TARGET_RATIO
    print("targets met" if met else "targets NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
