"""Dead-letter alerts: a real local webhook and a real Redis; rate-limited fleet-wide, nothing lost."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from reports.dead_message import DeadMessage
from reports.failures.alerts import SAMPLE_SIZE, WebhookAlerts
from tests.support.processes import free_port
from tests.support.waiting import wait_until

WINDOW_SECONDS = 1.0


@dataclass
class Webhook:
    """A local HTTP endpoint that keeps every JSON body posted to it, with when it arrived.

    ``answers`` scripts the next requests' answers: ``"garbage"`` (not HTTP at all),
    ``"redirect"`` (a 302 to ``redirect_to``); when it runs out, each post is kept and answered 200.
    """

    url: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    redirect_to: str = ""
    requests: int = 0

    @property
    def posts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [body for _, body in self.received]

    @property
    def times(self) -> list[float]:
        with self.lock:
            return [at for at, _ in self.received]


@contextmanager
def serve_webhook(host: str = "127.0.0.1") -> Iterator[Webhook]:
    port = free_port()
    hook = Webhook(url=f"http://{host}:{port}/hooks/T000/SECRET-TOKEN")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with hook.lock:
                hook.requests += 1
                answer = hook.answers.pop(0) if hook.answers else "ok"
                if answer == "ok":
                    hook.received.append((time.monotonic(), json.loads(body)))
            if answer == "garbage":
                self.wfile.write(b"SURPRISE\r\n\r\n")
                return
            self.send_response(302 if answer == "redirect" else 200)
            if answer == "redirect":
                self.send_header("Location", hook.redirect_to)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def do_GET(self) -> None:
            self.do_POST()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with serve_webhook() as hook:
        yield hook


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def dead_message(*, reason: str = "permanent", error_class: str = "MailRejected", user_id: int = 1) -> DeadMessage:
    now_ms = int(time.time() * 1000)
    return DeadMessage(
        message_id=uuid.uuid4().hex,
        actor="build_report",
        queue="bulk",
        args=("2026-10", user_id, "v1"),
        kwargs={},
        attempts=1,
        reason=reason,
        error_class=error_class,
        error_message="SMTP 550: 5.1.1 No such user",
        traceback="Traceback ...",
        first_failed_ms=now_ms,
        died_ms=now_ms,
    )


def test_ten_thousand_dead_letters_from_two_processes_are_a_handful_of_posts_and_none_is_lost(
    webhook: Webhook, redis_url: str, broker_namespace: str
) -> None:
    per_process = 5_000
    kinds = [("permanent", "MailRejected"), ("retries_exhausted", "MailDeferred")]
    processes = [
        WebhookAlerts(
            webhook.url, redis.Redis.from_url(redis_url), namespace=broker_namespace, window_seconds=WINDOW_SECONDS
        )
        for _ in range(2)
    ]
    sent_ids: set[str] = set()
    # Both "processes" build their dead letters up front, so the loop is nothing but dead_letter().
    batches = []
    for p in range(2):
        batch = [
            dead_message(reason=kinds[i % 2][0], error_class=kinds[i % 2][1], user_id=p * per_process + i + 1)
            for i in range(per_process)
        ]
        sent_ids.update(d.message_id for d in batch)
        batches.append(batch)
    start = threading.Barrier(3)

    def hammer(alerts: WebhookAlerts, batch: list[DeadMessage]) -> None:
        start.wait()
        for dead in batch:
            alerts.dead_letter(dead)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(hammer, alerts, batch) for alerts, batch in zip(processes, batches, strict=True)]
        start.wait()
        began = time.monotonic()
        for future in futures:
            future.result(timeout=120)  # re-raises whatever dead_letter() raised
        elapsed = time.monotonic() - began

    # Wait out more than two windows: what arrived after the last post goes out by itself.
    time.sleep(2.5 * WINDOW_SECONDS)
    posts = webhook.posts

    assert 1 <= len(posts) <= elapsed / WINDOW_SECONDS + 3, (len(posts), elapsed)
    assert sum(post["dead_letters"] for post in posts) == 2 * per_process
    by_reason: Counter[str] = Counter()
    for post in posts:
        by_reason.update(post["by_reason"])
        assert post["window_seconds"] == WINDOW_SECONDS
        assert f"{post['dead_letters']} report message(s) dead-lettered" in post["text"]
        assert 1 <= len(post["sample_message_ids"]) <= SAMPLE_SIZE
        assert set(post["sample_message_ids"]) <= sent_ids
        assert sum(post["by_reason"].values()) == post["dead_letters"]
    assert by_reason == {"permanent:MailRejected": per_process, "retries_exhausted:MailDeferred": per_process}
    # At most one post per window, fleet-wide. Slack for the HTTP round trip: the times are when
    # the posts arrived, and one that took 0.16 s longer than the next under a loaded machine's
    # scheduler read as 0.84 s apart.
    times = webhook.times
    assert all(later - earlier >= WINDOW_SECONDS - 0.25 for earlier, later in itertools.pairwise(times)), times
    # And nothing is left behind in Redis.
    time.sleep(0.5 * WINDOW_SECONDS)
    assert webhook.posts == posts


def test_the_first_dead_letter_after_a_quiet_period_is_posted_at_once(
    webhook: Webhook, redis_client: redis.Redis, broker_namespace: str
) -> None:
    alerts = WebhookAlerts(webhook.url, redis_client, namespace=broker_namespace, window_seconds=WINDOW_SECONDS)
    first = dead_message()

    began = time.monotonic()
    alerts.dead_letter(first)
    wait_until(lambda: webhook.posts, timeout=0.5, interval=0.01, what="the first post")
    assert webhook.times[0] - began < 0.5
    assert webhook.posts[0]["dead_letters"] == 1
    assert webhook.posts[0]["sample_message_ids"] == [first.message_id]
    assert webhook.posts[0]["by_reason"] == {"permanent:MailRejected": 1}

    # Quiet for more than a window: the next one goes out at once again, not at the next window.
    time.sleep(1.5 * WINDOW_SECONDS)
    assert len(webhook.posts) == 1
    second = dead_message(reason="retries_exhausted", error_class="ProviderUnavailable")
    began = time.monotonic()
    alerts.dead_letter(second)
    wait_until(lambda: len(webhook.posts) == 2, timeout=0.5, interval=0.01, what="the post after a quiet period")
    assert webhook.times[1] - began < 0.5
    assert webhook.posts[1]["by_reason"] == {"retries_exhausted:ProviderUnavailable": 1}


def test_a_dead_letter_inside_a_posted_window_goes_out_when_the_window_ends(
    webhook: Webhook, redis_client: redis.Redis, broker_namespace: str
) -> None:
    alerts = WebhookAlerts(webhook.url, redis_client, namespace=broker_namespace, window_seconds=WINDOW_SECONDS)
    alerts.dead_letter(dead_message())
    wait_until(lambda: webhook.posts, timeout=0.5, interval=0.01, what="the first post")

    late = dead_message(reason="broker", error_class="BrokerDeadLetter")
    alerts.dead_letter(late)  # the window's post has gone: this one waits, with no further dead letter
    time.sleep(0.3 * WINDOW_SECONDS)
    assert len(webhook.posts) == 1

    wait_until(lambda: len(webhook.posts) == 2, timeout=2 * WINDOW_SECONDS, interval=0.02, what="the window's end")
    assert webhook.times[1] - webhook.times[0] >= WINDOW_SECONDS - 0.1
    assert webhook.posts[1]["dead_letters"] == 1
    assert webhook.posts[1]["sample_message_ids"] == [late.message_id]


def test_a_webhook_that_is_down_does_not_fail_the_dead_letter_and_its_secret_is_not_logged(
    redis_client: redis.Redis, broker_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{free_port()}/hooks/T000/SECRET-TOKEN"  # nothing listens there
    alerts = WebhookAlerts(url, redis_client, namespace=broker_namespace, window_seconds=WINDOW_SECONDS)

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "reports.failures.alerts"]

    with caplog.at_level(logging.WARNING, logger="reports.failures.alerts"):
        for _ in range(20):
            alerts.dead_letter(dead_message())  # must not raise
        # The post fails in the flusher thread, a moment later.
        wait_until(failures, timeout=5, interval=0.01, what="the failed post's warning")
        time.sleep(0.5 * WINDOW_SECONDS)

    first = failures()[0]
    in_its_window = [r for r in failures() if r.created - first.created < 0.9 * WINDOW_SECONDS]
    assert len(in_its_window) == 1  # one attempt in the window, not one per dead letter
    assert "127.0.0.1" in first.getMessage()
    assert all("SECRET-TOKEN" not in r.getMessage() for r in caplog.records)


def test_the_sample_keeps_the_most_recent_message_ids(
    webhook: Webhook, redis_client: redis.Redis, broker_namespace: str
) -> None:
    alerts = WebhookAlerts(webhook.url, redis_client, namespace=broker_namespace, window_seconds=WINDOW_SECONDS)
    alerts.dead_letter(dead_message())
    wait_until(lambda: webhook.posts, timeout=0.5, interval=0.01, what="the first post")
    burst = [dead_message() for _ in range(25)]
    for dead in burst:
        alerts.dead_letter(dead)

    wait_until(lambda: len(webhook.posts) == 2, timeout=2 * WINDOW_SECONDS, interval=0.02, what="the second post")
    second = webhook.posts[1]
    assert second["dead_letters"] == 25
    assert second["sample_message_ids"] == [d.message_id for d in reversed(burst[-SAMPLE_SIZE:])]


def test_what_a_stopped_process_left_counted_is_posted_by_a_process_that_starts(
    webhook: Webhook, redis_client: redis.Redis, broker_namespace: str
) -> None:
    # As a process leaves it that counted three dead letters in a window whose post had gone out,
    # then stopped before the window ended.
    keys = f"{broker_namespace}:alerts"
    redis_client.set(f"{keys}:gate", "1", px=int(WINDOW_SECONDS * 1000))
    left = [dead_message() for _ in range(3)]
    for dead in left:
        redis_client.incr(f"{keys}:pending")
        redis_client.hincrby(f"{keys}:reasons", f"{dead.reason}:{dead.error_class}", 1)
        redis_client.lpush(f"{keys}:sample", dead.message_id)

    started = WebhookAlerts(webhook.url, redis_client, namespace=broker_namespace, window_seconds=WINDOW_SECONDS)
    started.watch()

    wait_until(lambda: webhook.posts, timeout=3 * WINDOW_SECONDS, interval=0.02, what="the post of what was left")
    assert webhook.posts[0]["dead_letters"] == 3
    assert webhook.posts[0]["sample_message_ids"] == [d.message_id for d in reversed(left)]


def alert_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "reports.failures.alerts" and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize(("answer", "error"), [("garbage", "BadStatusLine"), ("redirect", "HTTPError")])
def test_after_a_post_that_failed_the_next_windows_post_still_arrives_with_what_it_did_not_say(
    webhook: Webhook,
    redis_client: redis.Redis,
    broker_namespace: str,
    caplog: pytest.LogCaptureFixture,
    answer: str,
    error: str,
) -> None:
    webhook.answers = [answer]
    alerts = WebhookAlerts(webhook.url, redis_client, namespace=broker_namespace, window_seconds=WINDOW_SECONDS)
    with caplog.at_level(logging.WARNING, logger="reports.failures.alerts"), serve_webhook("127.0.0.2") as elsewhere:
        webhook.redirect_to = f"{elsewhere.url}/stolen"
        first = dead_message()
        alerts.dead_letter(first)
        wait_until(lambda: alert_warnings(caplog), timeout=5, interval=0.01, what="the failed post's warning")

        later = dead_message()
        alerts.dead_letter(later)
        wait_until(lambda: webhook.posts, timeout=3 * WINDOW_SECONDS, interval=0.02, what="the next window's post")
        assert elsewhere.requests == 0  # the redirect was not followed to the other host

    # The failed post's dead letter is told in the next one, not lost with it.
    assert webhook.posts[0]["dead_letters"] == 2
    assert webhook.posts[0]["sample_message_ids"] == [later.message_id, first.message_id]
    assert alert_warnings(caplog) == [f"Dead-letter alert to 127.0.0.1 failed: {error}"]
    assert all("SECRET-TOKEN" not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:notaport/hooks/T000/SECRET-TOKEN",  # http.client.InvalidURL
        "http://127.0.0.1:1/hooks/T000/SECRET-TOKEN\r\nX-Injected: 1",  # InvalidURL: a control character
        "hooks.example.test/T000/SECRET-TOKEN",  # ValueError: unknown url type
    ],
)
def test_a_webhook_url_that_cannot_be_posted_to_is_tried_again_every_window_without_its_secret(
    url: str, redis_client: redis.Redis, broker_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    alerts = WebhookAlerts(url, redis_client, namespace=broker_namespace, window_seconds=WINDOW_SECONDS)
    with caplog.at_level(logging.WARNING, logger="reports.failures.alerts"):
        alerts.dead_letter(dead_message())
        wait_until(lambda: alert_warnings(caplog), timeout=5, interval=0.01, what="the first failure")
        alerts.dead_letter(dead_message())
        wait_until(
            lambda: len(alert_warnings(caplog)) >= 2,
            timeout=3 * WINDOW_SECONDS,
            interval=0.02,
            what="the next window's attempt",
        )

    assert all(" failed: " in line for line in alert_warnings(caplog))
    assert all("SECRET-TOKEN" not in r.getMessage() for r in caplog.records)
