"""Provider webhooks through one `reports web` process: events per second and latency, per provider.

    python bench/feedback_webhooks.py [--database postgresql|sqlite] [--users 10000] [--requests 2000]
                                      [--threads 8] [--batch 50]

The client threads sign each request as they send it (the latency is measured from after the
signing). On a database of its own (PostgreSQL, seeded as ``reports seed`` does, or a SQLite file), it starts
`reports web` with every provider configured (SNS trusted through a CA the benchmark makes, its
certificate served by a local HTTPS server, as in the tests), then for each provider posts
``--requests`` signed requests from ``--threads`` threads, each on a keep-alive connection. Each
request is new: Mailgun and Postmark posts carry one event, SendGrid posts ``--batch`` events, SES
notifications one event; the events name seeded users' addresses, so each is stored, matched and
applied (a complaint or a hard bounce suppresses its user). It prints, per provider, requests and
events per second, and the p50 and p99 latency of a request, as the client saw it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from support import ROOT, free_port, seed_users, settings_environ, temporary_database  # bench/support.py

from reports.clock import utcnow
from reports.database import upgrade
from reports.feedback import ses
from reports.periods import previous_month
from reports.settings import Settings
from tests.support.feedback import (
    MAILGUN_KEY,
    POSTMARK_AUTH,
    TOPIC_ARN,
    SnsServer,
    mailgun_event,
    mailgun_post,
    postmark_authorization,
    postmark_bounce,
    postmark_complaint,
    sendgrid_event,
    sendgrid_headers,
    sendgrid_public_key,
    ses_notification,
    sns_server,
)

#: A request: (path, body, headers).
Request = tuple[str, bytes, dict[str, str]]


def requests_for(
    provider: str, sns: SnsServer, *, count: int, users: int, batch: int
) -> Iterator[tuple[Callable[[], Request], int]]:
    """``count`` new requests of ``provider``, each signed when it is sent (signatures carry the
    time), and the events each carries."""
    for n in range(count):
        address = f"user{n % users + 1}@example.test"
        if provider == "ses":
            notification = ses_notification("Complaint" if n % 2 else "Bounce", address)
            yield (lambda m=notification: _ses(sns, m)), 1
        elif provider == "sendgrid":
            posted = [
                sendgrid_event("spamreport", f"user{(n * batch + i) % users + 1}@example.test") for i in range(batch)
            ]
            body = json.dumps(posted).encode()
            yield (lambda b=body: ("/hooks/sendgrid", b, sendgrid_headers(b, int(time.time())))), batch
        elif provider == "postmark":
            record = json.dumps(postmark_complaint(address) if n % 2 else postmark_bounce(address)).encode()
            yield (lambda r=record: ("/hooks/postmark", r, {"Authorization": postmark_authorization()})), 1
        else:
            event = mailgun_event("complained" if n % 2 else "failed", address, severity="permanent")
            yield (lambda e=event: _mailgun(e)), 1


def _ses(sns: SnsServer, notification: str) -> Request:
    message = sns.message(ses.NOTIFICATION, message=notification)
    return "/hooks/ses", json.dumps(message).encode(), {"x-amz-sns-message-type": ses.NOTIFICATION}


def _mailgun(event: dict[str, object]) -> Request:
    return "/hooks/mailgun", json.dumps(mailgun_post(event, timestamp=int(time.time()))).encode(), {}


def drive(port: int, requests: list[tuple[Callable[[], Request], int]], threads: int) -> tuple[float, list[float], int]:
    """Post every request from ``threads`` threads; (wall seconds, latencies, events)."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    shares = [requests[i::threads] for i in range(threads)]

    def run(share: list[tuple[Callable[[], Request], int]]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        for make, _events in share:
            path, body, headers = make()
            started = time.perf_counter()
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
            response = connection.getresponse()
            response.read()
            mine.append(time.perf_counter() - started)
            if response.status != 200:
                with lock:
                    failures.append(f"{path}: {response.status}")
        connection.close()
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=run, args=(share,)) for share in shares]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} request(s) failed, first: {failures[0]}")
    return wall, latencies, sum(events for _, events in requests)


@contextlib.contextmanager
def web_process(settings: Settings, port: int, log_path: Path) -> Iterator[None]:
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "reports", "web", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env={**settings_environ(settings), "LOG_LEVEL": "WARNING"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"reports web did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


@contextlib.contextmanager
def database(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{workdir / 'reports.db'}"
    else:
        with temporary_database(prefix="bench_feedback") as url:
            yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=50, help="events per SendGrid post")
    parser.add_argument("--providers", default="ses,sendgrid,postmark,mailgun", help="comma-separated")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-feedback-") as temporary:
        workdir = Path(temporary)
        with database(args.database, workdir) as url, sns_server(workdir) as sns:
            port = free_port()
            settings = Settings(
                var_dir=workdir / "var",
                database_url=url,
                public_base_url=f"http://127.0.0.1:{port}",
                ses_topic_arns=TOPIC_ARN,
                sendgrid_webhook_public_key=sendgrid_public_key(),
                postmark_webhook_auth=":".join(POSTMARK_AUTH),
                mailgun_webhook_signing_key=MAILGUN_KEY,
                sns_test_ca_file=str(sns.pki.ca_file),
            )
            upgrade(settings)
            if args.database == "postgresql":
                seed_users(url, users=args.users, period=previous_month(utcnow()))
            else:
                _seed_sqlite(settings, args.users)
            print(
                f"reports web on {args.database}, {args.users:,} users, {args.requests:,} requests per provider, "
                f"{args.threads} client threads, {os.cpu_count()} CPUs"
            )
            print(f"{'provider':<10} {'requests/s':>11} {'events/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
            with web_process(settings, port, workdir / "web.log"):
                for provider in args.providers.split(","):
                    prepared = list(
                        requests_for(provider, sns, count=args.requests, users=args.users, batch=args.batch)
                    )
                    wall, latencies, events = drive(port, prepared, args.threads)
                    p50, p99 = _percentile(latencies, 50), _percentile(latencies, 99)
                    print(
                        f"{provider:<10} {len(prepared) / wall:>11,.0f} {events / wall:>10,.0f} "
                        f"{p50 * 1000:>8.1f} {p99 * 1000:>8.1f}"
                    )


def _percentile(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1] if len(values) > 1 else values[0]


def _seed_sqlite(settings: Settings, users: int) -> None:
    from reports.database import create_db_engine, session_factory
    from reports.ops.seed import seed

    engine = create_db_engine(settings.database_url)
    with session_factory(engine).begin() as session:
        seed(session, users=users, period=previous_month(utcnow()), inactive_percent=10, seed=1)
    engine.dispose()


if __name__ == "__main__":
    main()
