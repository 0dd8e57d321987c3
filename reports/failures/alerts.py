"""Dead-letter alerts to a webhook, rate-limited across every worker process through Redis.

Each dead letter adds to a shared count. At most one post goes out per window, fleet-wide:
whichever process wins the window's gate (``SET NX PX``) takes the count and posts a summary.
10,000 dead letters in a minute are a handful of posts, not 10,000. A period paused by the brake
(:mod:`reports.delivery.brake`) is posted at once: the brake trips once per pause.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis

from reports.dead_message import DeadMessage
from reports.delivery.brake import Tripped

logger = logging.getLogger(__name__)

#: Message ids kept as a sample in each post.
SAMPLE_SIZE = 10

_TAKE = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count == 0 then return nil end
local reasons = redis.call('HGETALL', KEYS[2])
local sample = redis.call('LRANGE', KEYS[3], 0, -1)
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return {count, reasons, sample}
"""


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would post the summary to whatever host it names
    (urllib re-sends a redirected POST as a GET to the new place)."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_RefuseRedirects)


def post_json(url: str, body: dict[str, Any], *, timeout_seconds: float) -> None:
    """POST ``body`` as JSON to ``url``; a redirect raises ``HTTPError`` instead of being followed."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with _opener.open(request, timeout=timeout_seconds) as response:
        response.read()


class WebhookAlerts:
    def __init__(
        self,
        url: str,
        client: redis.Redis,
        *,
        namespace: str,
        window_seconds: float,
        post: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.url = url
        self.client = client
        self.window_seconds = window_seconds
        self._keys = [f"{namespace}:alerts:{name}" for name in ("pending", "reasons", "sample")]
        self._gate = f"{namespace}:alerts:gate"
        self._take = client.register_script(_TAKE)
        self._post = post or (lambda url, body: post_json(url, body, timeout_seconds=5))
        self._flusher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def dead_letter(self, dead: DeadMessage) -> None:
        pending, reasons, sample = self._keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.incr(pending)
            pipe.hincrby(reasons, f"{dead.reason}:{dead.error_class}", 1)
            pipe.lpush(sample, dead.message_id)
            pipe.ltrim(sample, 0, SAMPLE_SIZE - 1)
            pipe.execute()
        # The post goes out from the flusher thread: a slow webhook never holds up a worker.
        self._ensure_flusher()
        self._wake.set()

    def period_paused(self, tripped: Tripped) -> None:
        """Post that the brake paused a period: what refused it, and how to resume."""
        body = {
            "text": f"Period {tripped.period} paused: {tripped.failures} users refused within "
            f"{tripped.window_seconds:g}s for a reason not about their address ({tripped.reply}). "
            f"Fix the cause, then `reports trigger {tripped.period}` resumes it.",
            "period": str(tripped.period),
            "failures": tripped.failures,
            "window_seconds": tripped.window_seconds,
            "reply": tripped.reply,
        }
        self._send(body, "Brake alert")

    def flush(self) -> bool:
        """Post what is pending if this window's post has not gone out yet; returns whether it posted."""
        if not self.client.set(self._gate, "1", nx=True, px=int(self.window_seconds * 1000)):
            return False
        taken = self._take(keys=self._keys)
        if taken is None:
            # Nothing to say: give the window back so the next dead letter posts at once.
            self.client.delete(self._gate)
            return False
        count, flat_reasons, sample = taken
        reasons = {flat_reasons[i].decode(): int(flat_reasons[i + 1]) for i in range(0, len(flat_reasons), 2)}
        body = {
            "text": f"{count} report message(s) dead-lettered in the last {self.window_seconds:g}s "
            f"(`reports dlq list` to see them).",
            "dead_letters": int(count),
            "by_reason": reasons,
            "sample_message_ids": [m.decode() for m in sample],
            "window_seconds": self.window_seconds,
        }
        if not self._send(body, "Dead-letter alert"):
            # Counted again for the next window's post: one that failed must not lose them.
            self._put_back(int(count), reasons, sample)
        return True

    def watch(self) -> None:
        """Post, from now on, what is pending when each window ends: also what a process that
        stopped before its window ended left counted."""
        self._ensure_flusher()

    def _put_back(self, count: int, reasons: dict[str, int], sample: list[bytes]) -> None:
        pending, by_reason, kept = self._keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.incrby(pending, count)
            for reason, n in reasons.items():
                pipe.hincrby(by_reason, reason, n)
            if sample:
                # Older than what came meanwhile (pushed to the head): after it.
                pipe.rpush(kept, *sample)
                pipe.ltrim(kept, 0, SAMPLE_SIZE - 1)
            pipe.execute()

    def _send(self, body: dict[str, Any], what: str) -> bool:
        """Post ``body``; whether it was taken."""
        try:
            self._post(self.url, body)
        except (OSError, ValueError, http.client.HTTPException) as e:
            # Refused, timed out, a redirect (HTTPError), garbage for an answer (BadStatusLine), a URL
            # http.client cannot use (InvalidURL)… Webhook URLs carry their secret in the path, and
            # some errors' text quotes it: log the host and the error's class only.
            logger.warning("%s to %s failed: %s", what, _host(self.url), type(e).__name__)
            return False
        return True

    def _ensure_flusher(self) -> None:
        # Woken by each dead letter, and on a timer: dead letters that arrive after a window's
        # post are sent when the window ends, even if no further dead letter comes.
        with self._lock:
            if self._flusher is None or not self._flusher.is_alive():
                self._flusher = threading.Thread(target=self._flush_forever, name="dead-letter-alerts", daemon=True)
                self._flusher.start()

    def _flush_forever(self) -> None:
        while True:
            self._wake.wait(self.window_seconds / 4)
            self._wake.clear()
            try:
                self.flush()
            except redis.RedisError:
                logger.warning("Dead-letter alert flush could not reach Redis.")
            except Exception as e:  # noqa: BLE001 (the last guard of a thread that must not die)
                # Whatever it was, the next window must still post: the thread never dies of it.
                logger.warning("Dead-letter alert flush failed: %s", type(e).__name__)


def _host(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None
