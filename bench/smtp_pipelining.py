"""Emails a second through one mailer to a provider some milliseconds away, with PIPELINING and without.

Usage: .venv/bin/python bench/smtp_pipelining.py [--emails 800] [--threads 8] [--delay-ms 10] [--repeats 3]

The SMTP sink (bench/smtp_sink.py) runs in a process of its own and writes every reply
--delay-ms after the command that asked for it, as a provider that far away would. It offers
PIPELINING in one run and not in the other. --threads threads share one ``SmtpMailer``, as a
worker process's threads do, and send --emails report-sized emails over their kept connections.
The two kinds alternate --repeats times. It prints each run's emails/s and wall time per email,
the medians, and their ratio; and checks that every email arrived once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from email.message import EmailMessage

import support  # noqa: F401  (bench/support.py: this checkout's code first on sys.path)
from smtp_sink import SmtpSink  # bench/smtp_sink.py, beside this script

from reports.delivery.mail.smtp import SmtpMailer

SENDER = "reports@reports.test"
#: About the size of a rendered report's text and HTML parts.
BODY = ("Your activity this month, category by category.\n" * 200).strip()


def email(user: int) -> tuple[bytes, str]:
    to = f"user{user}@example.test"
    built = EmailMessage()
    built["From"] = SENDER
    built["To"] = to
    built["Subject"] = "Your monthly report"
    built["Message-ID"] = f"<bench-{user}@reports.test>"
    built["X-Report-User-Id"] = str(user)
    built.set_content(BODY)
    return built.as_bytes(), to


def run(*, pipelining: bool, emails: int, threads: int, delay_ms: float) -> float:
    """Emails a second; raises if the sink did not get each email exactly once."""
    messages = [email(user) for user in range(emails)]
    with SmtpSink(reply_delay_ms=delay_ms, pipelining=pipelining) as sink:
        mailer = SmtpMailer(sink.url, timeout_seconds=30, sender=SENDER)
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda message: mailer.send(message[0], recipient=message[1]), messages))
        elapsed = time.perf_counter() - started
        delivered = sink.check(set(range(emails)))
        if not delivered.ok:
            raise SystemExit(delivered.describe())
    return emails / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emails", type=int, default=800)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.emails} emails, {args.threads} threads, each reply {args.delay_ms:g} ms after its command")
    rates: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(args.repeats):
        for pipelining in (True, False) if repeat % 2 == 0 else (False, True):
            rate = run(pipelining=pipelining, emails=args.emails, threads=args.threads, delay_ms=args.delay_ms)
            rates[pipelining].append(rate)
            per_email = 1000 * args.threads / rate
            kind = "PIPELINING" if pipelining else "one command at a time"
            print(f"#{repeat + 1} {kind:>21}: {rate:7.1f} emails/s, {per_email:6.1f} ms per email per thread")
    with_, without = (statistics.median(rates[kind]) for kind in (True, False))
    print(f"median: PIPELINING {with_:.1f} emails/s, one command at a time {without:.1f}: {with_ / without:.2f}x")


if __name__ == "__main__":
    main()
